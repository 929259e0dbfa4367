"""``gateway clients``: register MCP servers and manage their tokens."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import click

from gateway import cli
from gateway.clients import service
from gateway.clients.models import ApiToken, Client
from gateway.clock import SystemClock
from gateway.credentials.catalog import CatalogError, catalog_of
from gateway.outbound import OutboundPolicy
from gateway.pagination import timestamp

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


@click.group(cls=cli.Group)
def clients() -> None:
    """MCP servers allowed to create elicitations."""


@clients.command()
@click.argument("name")
@click.option("--webhook-url", help="Where completion webhooks go (https).")
@click.option("--credential-types", default="",
              help="Comma-separated credential type ids this client may ask for (default: all).")
@json_option
def create(name: str, webhook_url: str | None, credential_types: str, as_json: bool) -> None:
    """Register an MCP server; prints its API token and webhook secret once."""
    settings = cli.settings()
    keyring = cli.key_versions()
    try:
        catalog = catalog_of(settings)
    except CatalogError as error:
        cli.fail(str(error))
    types = [t.strip() for t in credential_types.split(",") if t.strip()]
    minted = cli.sealed_transaction(keyring, lambda session: service.create_client(
        session, SystemClock(), keyring=keyring, pepper=settings.token_pepper,
        catalog=catalog, name=name, webhook_url=webhook_url, credential_types=types,
        actor=cli.operator(), policy=OutboundPolicy.from_settings(settings)))
    result = {"client_id": minted.client.id, "name": minted.client.name,
              "api_token": minted.api_token, "webhook_secret": minted.webhook_secret}
    if as_json:
        cli.echo_json(result)
        return
    click.echo(f"client {minted.client.id} ({minted.client.name}) registered")
    click.echo(f"api token:      {minted.api_token}")
    click.echo(f"webhook secret: {minted.webhook_secret}")
    click.secho("Both are shown this once; store them in the MCP server's secret store now.",
                fg="yellow")


@clients.command(name="list")
@json_option
def list_clients(as_json: bool) -> None:
    """Every registered client."""
    with cli.transaction() as session:
        rows = [_summary(c) for c in service.list_clients(session)]
    if as_json:
        cli.echo_json(rows)
    else:
        cli.echo_table(rows, ["client_id", "name", "status", "live_tokens", "webhook_url",
                              "credential_types", "created_at"])


@clients.command()
@click.argument("client")
@json_option
def show(client: str, as_json: bool) -> None:
    """One client (by id or name), with its tokens (masked)."""
    with cli.transaction() as session:
        found = service.get_client(session, client)
        summary = _summary(found)
        tokens = [_token(t) for t in found.tokens]
    if as_json:
        cli.echo_json({**summary, "tokens": tokens})
        return
    for key, value in summary.items():
        click.echo(f"{key + ':':18}{cli.cell(value)}")
    click.echo("tokens:")
    cli.echo_table(tokens, ["token_id", "hint", "created_at", "revoked_at"])


@clients.command(name="rotate-token")
@click.argument("client")
@json_option
def rotate_token(client: str, as_json: bool) -> None:
    """Add an API token; the old ones keep working until revoked."""
    settings = cli.settings()
    with cli.transaction() as session:
        record, token = service.rotate_token(session, SystemClock(),
                                             pepper=settings.token_pepper, client_ref=client,
                                             actor=cli.operator())
        client_id = record.client_id
    if as_json:
        cli.echo_json({"client_id": client_id, "token_id": record.id, "api_token": token})
        return
    click.echo(f"new api token {record.id}: {token}")
    click.secho("Shown this once. Revoke the old token when the MCP server uses the new one:\n"
                f"  gateway clients revoke-token {client_id} TOKEN_ID", fg="yellow")


@clients.command(name="revoke-token")
@click.argument("client")
@click.argument("token_id")
def revoke_token(client: str, token_id: str) -> None:
    """End one API token of a client at once."""
    with cli.transaction() as session:
        record = service.revoke_token(session, SystemClock(), client_ref=client,
                                      token_id=token_id, actor=cli.operator())
    click.echo(f"token {record.id} ({record.hint}) revoked")


@clients.command(name="rotate-webhook-secret")
@click.argument("client")
@json_option
def rotate_webhook_secret(client: str, as_json: bool) -> None:
    """A new webhook secret, printed once; the old one signs beside it during the grace."""
    settings = cli.settings()
    keyring = cli.key_versions()
    grace = timedelta(hours=settings.webhook_secret_grace_hours)
    secret = cli.sealed_transaction(keyring, lambda session: service.rotate_webhook_secret(
        session, SystemClock(), keyring=keyring, client_ref=client, grace=grace,
        actor=cli.operator()))
    if as_json:
        cli.echo_json({"client": client, "webhook_secret": secret,
                       "grace_hours": settings.webhook_secret_grace_hours})
        return
    click.echo(f"new webhook secret: {secret}")
    click.secho(f"Shown this once. For {settings.webhook_secret_grace_hours} h every delivery "
                "is signed with both the old and the new secret: switch the MCP server to "
                "the new one within that time.", fg="yellow")


@clients.command(name="set-webhook-url")
@click.argument("client")
@click.argument("url")
def set_webhook_url(client: str, url: str) -> None:
    """Send a client's webhooks to another URL, those waiting for a retry included."""
    settings = cli.settings()
    with cli.transaction() as session:
        found = service.change_webhook_url(session, SystemClock(), client_ref=client,
                                           webhook_url=url, actor=cli.operator(),
                                           policy=OutboundPolicy.from_settings(settings))
    click.echo(f"client {found.id} ({found.name}) sends its webhooks to {url}")


@clients.command()
@click.argument("client")
def disable(client: str) -> None:
    """Stop a client: its tokens stop working at once."""
    with cli.transaction() as session:
        found = service.disable_client(session, SystemClock(), client_ref=client,
                                       actor=cli.operator())
    click.echo(f"client {found.id} ({found.name}) disabled")


def _summary(client: Client) -> dict[str, Any]:
    return {
        "client_id": client.id,
        "name": client.name,
        "status": client.status,
        "webhook_url": client.webhook_url,
        "credential_types": client.credential_types,
        "live_tokens": sum(1 for t in client.tokens if t.live),
        "created_at": timestamp(client.created_at),
    }


def _token(token: ApiToken) -> dict[str, Any]:
    return {"token_id": token.id, "hint": token.hint, "created_at": timestamp(token.created_at),
            "revoked_at": timestamp(token.revoked_at)}
