"""Registering MCP servers, minting and revoking their tokens, authenticating them.

Every change is one transaction with its audit row. Secrets are returned to
the caller once, when minted, and stored only as a keyed digest (API tokens)
or sealed by the vault (webhook secrets, which the gateway must read back to
sign deliveries).
"""

from __future__ import annotations

import base64
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final
from urllib.parse import urlsplit

from sqlalchemy import ColumnElement, Connection, Executable, RowMapping, and_, bindparam, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gateway.audit import service as audit
from gateway.clients.models import ApiToken, Client, ClientIdentity, WebhookSecret
from gateway.clock import Clock
from gateway.credentials.catalog import Catalog
from gateway.errors import Conflict, GatewayError, InvalidInput, NotFound
from gateway.outbound import BlockedDestination, OutboundPolicy
from gateway.settings import Secret
from gateway.tokens import keyed_digest, new_id, new_token, token_hint
from gateway.vault.envelope import bind, reveal_plaintext, seal
from gateway.vault.keyring import KeySource
from gateway.vault.sealing import refers_to_missing_version

API_TOKEN_PREFIX: Final = "gw_"  # noqa: S105  (a prefix, not a secret)
WEBHOOK_SECRET_PREFIX: Final = "whsec_"  # noqa: S105  (a prefix, not a secret)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,99}")


class Unauthenticated(GatewayError):
    """No token, or one that matches no live token of an active client."""

    status = 401
    code = "unauthenticated"
    title = "Unauthenticated"

    def __init__(self, detail: str, *, error: str | None = "invalid_token") -> None:
        super().__init__(detail)
        self.error = error

    def headers(self) -> dict[str, str]:
        # RFC 6750 section 3: a request without credentials gets no error code.
        challenge = 'Bearer realm="gateway"'
        if self.error:
            challenge += f', error="{self.error}"'
        return {"WWW-Authenticate": challenge}


@dataclass(frozen=True, slots=True)
class Minted:
    """A new client and the secrets shown to the operator this once."""

    client: Client
    api_token: str
    webhook_secret: str


def create_client(
    session: Session, clock: Clock, *, keyring: KeySource, pepper: Secret, catalog: Catalog,
    name: str, webhook_url: str | None, credential_types: list[str], actor: str,
    policy: OutboundPolicy,
) -> Minted:
    """Register an MCP server with one API token and one webhook secret."""
    check_name(name)
    if webhook_url is not None:
        check_webhook_url(webhook_url, policy)
    for type_id in credential_types:
        if type_id not in catalog:
            raise InvalidInput(f"unknown credential type {type_id!r}; "
                               f"the catalog has {', '.join(catalog.ids)}")
    if session.scalar(select(Client.id).where(Client.name == name)) is not None:
        raise Conflict(f"a client named {name!r} exists already")
    now = clock.now()
    client = Client(id=new_id("cl_"), name=name, status="active", webhook_url=webhook_url,
                    credential_types=sorted(set(credential_types)), created_at=now)
    session.add(client)
    token = _add_token(session, client, pepper, now)
    webhook_secret = _add_webhook_secret(session, client, keyring, now)
    audit.record(session, clock, actor=actor, action="client.created", target=client.id,
                 details={"name": name, "webhook_url": webhook_url,
                          "credential_types": client.credential_types})
    _flush_unique(session, f"a client named {name!r} exists already")
    return Minted(client, token, webhook_secret)


def rotate_token(session: Session, clock: Clock, *, pepper: Secret, client_ref: str,
                 actor: str) -> tuple[ApiToken, str]:
    """Add a live token to a client; the old ones stay live until revoked."""
    client = get_client(session, client_ref)
    token = _add_token(session, client, pepper, clock.now())
    record = client.tokens[-1]
    audit.record(session, clock, actor=actor, action="client.token_added", target=client.id,
                 details={"token_id": record.id, "hint": record.hint})
    return record, token


def revoke_token(session: Session, clock: Clock, *, client_ref: str, token_id: str,
                 actor: str) -> ApiToken:
    """End one token of a client at once."""
    client = get_client(session, client_ref)
    record = next((t for t in client.tokens if t.id == token_id), None)
    if record is None:
        raise NotFound(f"client {client.id} has no token {token_id!r}")
    if not record.live:
        raise Conflict(f"token {token_id} was revoked already")
    record.revoked_at = clock.now()
    audit.record(session, clock, actor=actor, action="client.token_revoked", target=client.id,
                 details={"token_id": record.id, "hint": record.hint})
    return record


def rotate_webhook_secret(session: Session, clock: Clock, *, keyring: KeySource, client_ref: str,
                          grace: timedelta, actor: str) -> str:
    """A new webhook secret; the old one keeps signing beside it for ``grace``."""
    client = get_client(session, client_ref)
    now = clock.now()
    for row in session.scalars(select(WebhookSecret).where(
            WebhookSecret.client_id == client.id)):
        if row.retires_at is None or row.retires_at > now + grace:
            row.retires_at = now + grace
    secret = _add_webhook_secret(session, client, keyring, now)
    audit.record(session, clock, actor=actor, action="client.webhook_secret_rotated",
                 target=client.id, details={"grace_hours": grace.total_seconds() / 3600})
    return secret


def change_webhook_url(session: Session, clock: Clock, *, client_ref: str, webhook_url: str,
                       actor: str, policy: OutboundPolicy) -> Client:
    """Send a client's webhooks to another URL, the ones still due included.

    Deliveries read the URL when they are sent, so the events waiting for a
    retry go to the new URL too, with their ``webhook-id`` unchanged.
    """
    check_webhook_url(webhook_url, policy)
    client = get_client(session, client_ref)
    previous = client.webhook_url
    if previous != webhook_url:
        client.webhook_url = webhook_url
        audit.record(session, clock, actor=actor, action="client.webhook_url_changed",
                     target=client.id, details={"from": previous, "to": webhook_url})
    return client


def disable_client(session: Session, clock: Clock, *, client_ref: str, actor: str) -> Client:
    """Stop a client: its tokens stop working; its records stay for the audit trail."""
    client = get_client(session, client_ref)
    if not client.active:
        raise Conflict(f"client {client.id} is disabled already")
    client.status = "disabled"
    client.disabled_at = clock.now()
    audit.record(session, clock, actor=actor, action="client.disabled", target=client.id)
    return client


def get_client(session: Session, client_ref: str) -> Client:
    """A client by id or by name."""
    client = session.get(Client, client_ref) or session.scalar(
        select(Client).where(Client.name == client_ref))
    if client is None:
        raise NotFound(f"no client with id or name {client_ref!r}")
    return client


def list_clients(session: Session) -> list[Client]:
    """Every client, oldest first."""
    return list(session.scalars(select(Client).order_by(Client.created_at, Client.id)))


def name_of(session: Session, client_id: str) -> str:
    """The client's registered name, as pages show it to users."""
    name: str = session.execute(select(Client.name).where(Client.id == client_id)).scalar_one()
    return name


class ClientNames:
    """Clients' registered names by id, each read from the database once.

    A client's name is set when it is registered and never changes, and
    pages show it on almost every answer: a process keeps the names it has
    read (as many as there are clients) instead of reading one per page.
    """

    def __init__(self) -> None:
        self._names: dict[str, str] = {}

    def of(self, client_id: str, session: Session) -> str:
        """The client's name, read on first use in ``session``."""
        name = self._names.get(client_id)
        if name is None:
            name = self._names[client_id] = name_of(session, client_id)
        return name


def webhook_url_of(session: Session, client_id: str) -> str | None:
    """Where the client's webhooks go; None when it takes none."""
    url: str | None = session.connection().execute(
        _WEBHOOK_URL, {"client_id": client_id}).scalar_one()
    return url


_WEBHOOK_URL: Final = select(Client.webhook_url).where(Client.id == bindparam("client_id"))


def identity_of(client: Client) -> ClientIdentity:
    """What the rules need of a client, from its mapped row."""
    return ClientIdentity(client.id, client.name, tuple(client.credential_types or ()))


def authenticate(connection: Connection, token_digest: str | None) -> ClientIdentity:
    """The active client holding the live token with this keyed digest."""
    client, _ = authenticate_joined(connection, token_digest, _TOKEN_CHECK, {})
    return client


def authenticate_joined(connection: Connection, token_digest: str | None,
                        statement: Executable, parameters: Mapping[str, Any],
                        ) -> tuple[ClientIdentity, RowMapping]:
    """:func:`authenticate` by ``statement``: the token check joined with one row more.

    ``statement`` comes from :func:`token_check_joined`; ``parameters`` bind
    its own part. Returns the client and the whole row, whose joined columns
    are None when no row of the client matched.
    """
    if token_digest is None:
        raise Unauthenticated("send the client's API token as `Authorization: Bearer gw_…`",
                              error=None)
    # The lookup is by digest: no stored token is ever compared with the
    # presented one, so there is no timing difference to measure. Read on
    # every request, never cached: a revoked token is refused at once.
    row = connection.execute(statement, {**parameters, "digest": token_digest}).mappings().first()
    if row is None or row["token_revoked_at"] is not None:
        raise Unauthenticated("the API token is not valid: unknown or revoked")
    if row["client_status"] != "active":
        raise Unauthenticated("this client is disabled; ask the gateway's operator")
    return ClientIdentity(row["client_id"], row["client_name"],
                          tuple(row["client_credential_types"] or ())), row


def token_check_joined(target: Any, client_column: Any, condition: ColumnElement[bool],
                       *columns: ColumnElement[Any]) -> Executable:
    """The token check reading one row of ``target`` too, in the same statement.

    The row is the one that meets ``condition`` and whose ``client_column``
    names the token's client (outer-joined: the check answers as alone when
    there is none). Built once by the caller; ``columns`` are labelled apart
    from the check's own (``client_…``, ``token_revoked_at``).
    """
    return _TOKEN_CHECK.add_columns(*columns).outerjoin(
        target, and_(client_column == Client.id, condition))


# Built once, run on every API request with the presented token's digest.
_TOKEN_CHECK: Final = (
    select(Client.id.label("client_id"), Client.name.label("client_name"),
           Client.status.label("client_status"),
           Client.credential_types.label("client_credential_types"),
           ApiToken.revoked_at.label("token_revoked_at"))
    .select_from(Client)
    .join(ApiToken, ApiToken.client_id == Client.id)
    .where(ApiToken.digest == bindparam("digest")))


def current_webhook_secrets(session: Session, clock: Clock, keyring: KeySource,
                            client: Client) -> list[str]:
    """The secrets deliveries are signed with now: the current one, then any in grace."""
    now = clock.now()
    rows = session.scalars(
        select(WebhookSecret).where(WebhookSecret.client_id == client.id)
        .order_by(WebhookSecret.created_at.desc())
    )
    return [
        reveal_plaintext(keyring, row.envelope, webhook_secret_binding(row)).decode()
        for row in rows if row.retires_at is None or row.retires_at > now
    ]


def check_name(name: str) -> None:
    """Refuse names that would not print cleanly on a page or in a table."""
    if not _NAME.fullmatch(name):
        raise InvalidInput("a client name is 1 to 100 letters, digits, spaces, '.', '_' or '-', "
                           "starting with a letter or digit")


def check_webhook_url(url: str, policy: OutboundPolicy) -> None:
    """A webhook URL the SSRF guard lets through: https, a public host, no credentials.

    A name that does not resolve yet is accepted: every delivery checks again.
    """
    try:
        parts = urlsplit(url)
        # urlsplit parses the port only when asked, and refuses one past 65535 then.
        given_port = parts.port
    except ValueError as error:
        raise InvalidInput(f"webhook URL is not a URL ({error}): {url!r}") from None
    if not parts.hostname or parts.scheme not in ("https", "http"):
        raise InvalidInput(f"webhook URL must be an https:// URL, got {url!r}")
    if parts.username or parts.password:
        raise InvalidInput("webhook URL must not carry a user name or password")
    if parts.fragment:
        raise InvalidInput("webhook URL must not have a #fragment")
    port = given_port or (443 if parts.scheme == "https" else 80)
    try:
        policy.checked_addresses(parts.scheme, parts.hostname, port)
    except BlockedDestination as error:
        raise InvalidInput(f"webhook URL refused: {error.reason}") from None
    except OSError:
        pass  # not resolvable from here now; the guard decides at send time


def _add_token(session: Session, client: Client, pepper: Secret, now: datetime) -> str:
    token = new_token(API_TOKEN_PREFIX)
    client.tokens.append(ApiToken(id=new_id("tok_", 9), digest=keyed_digest(pepper, token),
                                  hint=token_hint(token), created_at=now))
    return token


def _add_webhook_secret(session: Session, client: Client, keyring: KeySource, now: datetime) -> str:
    secret = WEBHOOK_SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()
    row = WebhookSecret(id=new_id("whs_", 9), client_id=client.id, created_at=now)
    row.envelope = seal(keyring, secret.encode(), webhook_secret_binding(row))
    session.add(row)
    return secret


def webhook_secret_binding(row: WebhookSecret) -> bytes:
    """The associated data that ties a webhook secret's ciphertext to its row."""
    return bind(purpose="webhook_secret", id=row.id, client_id=row.client_id)


def _flush_unique(session: Session, message: str) -> None:
    try:
        session.flush()
    except IntegrityError as error:
        if refers_to_missing_version(error):
            raise  # a webhook secret sealed under a retired key version: sealed again
        raise Conflict(message) from None
