"""``gateway credentials``: stored keys across clients (metadata only, never a secret)."""

from __future__ import annotations

import re
from datetime import timedelta

import click
from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway import cli
from gateway.clock import SystemClock
from gateway.credentials import service
from gateway.credentials.catalog import catalog_of
from gateway.credentials.models import Credential
from gateway.errors import NotFound
from gateway.oauth import revocation
from gateway.oauth.provider import Provider

_AGE = re.compile(r"([1-9][0-9]*)([dh])")


@click.group(cls=cli.Group)
def credentials() -> None:
    """Keys users stored, for the operator: list, revoke, purge."""


@credentials.command(name="list")
@click.option("--client", "client_id", help="Only this client's (by id).")
@click.option("--subject-sub", help="Only this user's.")
@click.option("--all", "include_revoked", is_flag=True, help="Include revoked ones.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def list_credentials(client_id: str | None, subject_sub: str | None, include_revoked: bool,
                     as_json: bool) -> None:
    """Stored credentials, newest first: type, owner, hint, dates."""
    query = select(Credential).order_by(Credential.created_at.desc())
    if client_id:
        query = query.where(Credential.client_id == client_id)
    if subject_sub:
        query = query.where(Credential.subject_sub == subject_sub)
    if not include_revoked:
        query = query.where(Credential.revoked_at.is_(None))
    with cli.transaction() as session:
        rows = [{**service.represent(c), "client_id": c.client_id}
                for c in session.scalars(query)]
    if as_json:
        cli.echo_json(rows)
        return
    cli.echo_table([{**r, "subject_sub": r["subject"]["sub"]} for r in rows],
                   ["id", "client_id", "type", "subject_sub", "hint", "status", "created_at"])


@credentials.command()
@click.argument("credential_id")
def revoke(credential_id: str) -> None:
    """Revoke a credential (a connection at its provider too): it can no longer be revealed."""

    def find(session: Session) -> Credential:
        credential = session.get(Credential, credential_id)
        if credential is None:
            raise NotFound(f"no credential {credential_id!r}")
        return credential

    _, outcome = revocation.revoke(
        cli.transaction, find, revocation.AtProvider(cli.open_key_versions, _provider_of),
        clock=SystemClock(), actor=cli.operator(), source_ip=None,
        reason=service.Reason.OPERATOR)
    click.echo(f"credential {credential_id} revoked")
    if outcome is not None:
        click.echo(f"at the provider: {outcome}")


def _provider_of(type_id: str) -> Provider | None:
    # A command has no app: the catalog is read and the client made here,
    # from the same settings the app would use.
    credential_type = catalog_of(cli.settings()).get(type_id)
    if credential_type is None or credential_type.oauth is None:
        return None
    return Provider(credential_type, cli.settings())


@credentials.command()
@click.option("--revoked-older-than", "age", required=True, metavar="AGE",
              help="Delete credentials revoked longer ago than this, e.g. 30d or 12h.")
def purge(age: str) -> None:
    """Delete revoked credentials for good, ciphertext and all."""
    match = _AGE.fullmatch(age)
    if not match:
        cli.fail(f"--revoked-older-than takes a number of days or hours, e.g. 30d; got {age!r}")
    amount = int(match[1])
    older_than = timedelta(days=amount) if match[2] == "d" else timedelta(hours=amount)
    with cli.transaction() as session:
        count = service.purge_revoked(session, SystemClock(), older_than, actor=cli.operator())
    click.echo(f"{count} revoked credential(s) deleted")
