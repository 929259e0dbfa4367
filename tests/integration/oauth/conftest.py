"""OAuth connections against a real provider: the test OpenID Connect provider's ``connect-app``.

The gateway's catalog gets one OAuth type, ``example``, pointing at the
provider's issuer (plain http on loopback, so its host is on the outbound
allow-list) with ``connect-app``'s client secret in an environment variable.
A connection is made the way the callback makes it: a real code flow at the
provider gives a real token response, which is sealed and stored with a
completed elicitation in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from flask import Flask
from sqlalchemy import select

from gateway import db
from gateway.app import create_app
from gateway.audit.models import AuditEvent
from gateway.clock import FixedClock
from gateway.credentials import service
from gateway.credentials.catalog import current_catalog
from gateway.credentials.models import Credential
from gateway.elicitations.models import Elicitation
from gateway.oauth.tokens import TokenSet, granted_scopes, reveal_token_set, seal_connection
from gateway.settings import Settings
from gateway.tokens import new_id
from gateway.vault.keyring import current_keyring
from gateway.webhooks.models import WebhookEvent
from tests.conftest import Api, Registered, client_for
from tests.oidc.fixtures import OidcProvider

TYPE = "example"
SECRET_ENV = "EXAMPLE_CONNECT_CLIENT_SECRET"
SCOPE = "openid profile repo"
# The provider's access tokens live 300 s; the gateway refreshes within 60 s of expiry.
TOKEN_SECONDS = 300
MARGIN_SECONDS = 60
# Short, so that a slow provider is given up on quickly; the "slow" fault holds 3 s.
TIMEOUT_SECONDS = 2
WEBHOOK_URL = "https://mcp.example.com/hooks"


def catalog_text(issuer: str) -> str:
    """The test catalog: the required ``generic`` type and the OAuth type ``example``."""
    return f"""
[generic]
label = "API key"

[{TYPE}]
label = "Example account"
kind = "oauth"

[{TYPE}.oauth]
issuer = "{issuer}"
client_id = "connect-app"
client_secret_env = "{SECRET_ENV}"
scopes = {SCOPE.split()!r}
timeout_seconds = {TIMEOUT_SECONDS}
""".replace("'", '"')


@pytest.fixture
def catalog_file(tmp_path: Path, oidc_provider: OidcProvider) -> Path:
    path = tmp_path / "credential_types.toml"
    path.write_text(catalog_text(oidc_provider.issuer))
    return path


@pytest.fixture
def base_environ(base_environ: dict[str, str], catalog_file: Path,
                 oidc_provider: OidcProvider, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The gateway with the OAuth type, allowed to reach the provider over plain http."""
    monkeypatch.setenv(SECRET_ENV, oidc_provider.connect_client_secret)
    return {**base_environ, "GATEWAY_CREDENTIAL_TYPES_FILE": str(catalog_file),
            "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": urlsplit(oidc_provider.issuer).netloc,
            "GATEWAY_OAUTH_REFRESH_MARGIN_SECONDS": str(MARGIN_SECONDS)}


@pytest.fixture
def cli_environ(cli_environ: dict[str, str], oidc_provider: OidcProvider) -> dict[str, str]:
    """Commands see the client secret as the app does."""
    return {**cli_environ, SECRET_ENV: oidc_provider.connect_client_secret}


@pytest.fixture
def mcp(register: Callable[..., Registered]) -> Registered:
    """The MCP server that asked for the connections, with a webhook endpoint."""
    return register("Example MCP", webhook_url=WEBHOOK_URL)


@pytest.fixture
def api(app: Flask, mcp: Registered) -> Api:
    return Api(client_for(app), mcp.api_token)


@dataclass(frozen=True)
class Connection:
    """A stored connection, and the token response it was made from."""

    id: str
    answer: dict[str, Any]

    @property
    def access_token(self) -> str:
        token: str = self.answer["access_token"]
        return token

    @property
    def refresh_token(self) -> str:
        token: str = self.answer["refresh_token"]
        return token


@pytest.fixture
def connect(app: Flask, settings: Settings, clock: FixedClock, mcp: Registered,
            oidc_provider: OidcProvider) -> Callable[..., Connection]:
    """Connect ``username``'s account at the provider for the MCP server, as the callback does.

    ``answer`` stores that token response instead of the provider's. The
    provider's counters start from zero afterwards, so a test counts only its
    own refreshes.
    """

    def make(username: str = "alice", answer: dict[str, Any] | None = None) -> Connection:
        answer = answer or oidc_provider.connect_tokens(username, scope=SCOPE)
        now = clock.now()
        with app.app_context(), db.transaction() as session:
            elicitation = Elicitation(
                id=new_id("el_", 18), client_id=mcp.id, subject_iss=settings.public_url,
                subject_sub=username, kind="oauth", credential_type=TYPE,
                scopes=SCOPE.split(), message="Connect your Example account",
                metadata_={}, status="opened", created_at=now,
                expires_at=now + timedelta(minutes=15), opened_at=now, ended_at=None)
            session.add(elicitation)
            session.flush()
            credential_type = current_catalog().get(TYPE)
            assert credential_type is not None
            credential = seal_connection(
                current_keyring(), elicitation, credential_type, answer,
                scopes=granted_scopes(answer, tuple(SCOPE.split())), account=username,
                now=now)
            service.capture(session, clock, elicitation, credential,
                            actor=f"user:{username}@{settings.public_url}", source_ip=None)
        oidc_provider.reset_connect_stats()
        return Connection(credential.id, answer)

    return make


@pytest.fixture
def other_app(settings: Settings, clock: FixedClock) -> Iterator[Flask]:
    """A second instance on the same database, as behind a load balancer; the same clock."""
    application = create_app(settings, clock=clock)
    application.config["TESTING"] = True
    yield application
    application.extensions["gateway.engine"].dispose()


# --- what the database says ---------------------------------------------------------------


def stored(app: Flask, credential_id: str) -> Credential:
    """The credential's row as it is now."""
    with app.app_context():
        found = db.session().get(Credential, credential_id)
        assert found is not None
        return found


def tokens_of(app: Flask, credential_id: str) -> TokenSet:
    """The token set sealed in the credential's row."""
    with app.app_context():
        return reveal_token_set(current_keyring(), stored(app, credential_id))


def audit_rows(app: Flask, action: str, target: str) -> list[AuditEvent]:
    with app.app_context():
        return list(db.session().scalars(select(AuditEvent).where(
            AuditEvent.action == action, AuditEvent.target == target)
            .order_by(AuditEvent.id)))


def revoked_events(app: Flask) -> list[WebhookEvent]:
    """The ``credential.revoked`` events in the outbox, oldest first."""
    with app.app_context():
        return list(db.session().scalars(select(WebhookEvent).where(
            WebhookEvent.type == "credential.revoked").order_by(WebhookEvent.created_at)))


def refresh_calls(provider: OidcProvider) -> int:
    """How many refresh requests ``connect-app`` sent since the counters were zeroed."""
    calls: int = provider.connect_stats()["token_calls"].get("refresh_token", 0)
    return calls
