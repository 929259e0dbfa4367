"""Every security-relevant action leaves one audit record: who, what, target, from where, outcome.

One row per action, each done for real: through the JSON API as an MCP server
calls it, through the portal in a browser, or with the ``gateway`` command as
an operator types it. Each row says the record it must leave.
"""

from __future__ import annotations

import base64
import getpass
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway import db, migrations
from gateway.app import create_app
from gateway.audit.models import AuditEvent
from gateway.audit.service import Outcome
from gateway.clock import FixedClock, SystemClock
from gateway.identity import service as identity
from gateway.settings import Settings
from tests.conftest import TEST_KEYRING, Api, Registered, client_for
from tests.integration.conftest import Result, free_port
from tests.integration.portal.conftest import PASSWORD, Browser
from tests.oidc.fixtures import OidcProvider, new_session

pytestmark = pytest.mark.slow

# Where requests come from: each actor from its own address, so a record
# cannot show the right one by chance.
USER_IP = "198.51.100.23"
SERVER_IP = "203.0.113.40"
OPERATOR = f"operator:{getpass.getuser()}"
KEY = "wx-live-5c1e9a7b3d2f4e6a8b0c"
NEW_KEY = "v2:" + base64.b64encode(b"n" * 32).decode()


@dataclass(frozen=True)
class Expected:
    """The record an action must leave."""

    action: str
    actor: str
    target: str | None
    source_ip: str | None
    outcome: Outcome = "success"
    database_url: str | None = None  # another database than the app's


class World:
    """A gateway with an MCP server and local users, and the ways to act on it."""

    def __init__(self, request: pytest.FixtureRequest, app: Flask, settings: Settings,
                 clock: FixedClock, server: Registered, invoke_gateway: Callable[..., Result],
                 cli_environ: dict[str, str], make_settings: Callable[..., Settings]) -> None:
        self.request, self.app, self.settings, self.clock = request, app, settings, clock
        self.server = server
        self.api = Api(self._client(app, SERVER_IP), server.api_token)
        self._run, self.cli_environ = invoke_gateway, cli_environ
        self._make_settings = make_settings

    # --- who acts ----------------------------------------------------------------------

    @staticmethod
    def _client(app: Flask, address: str) -> FlaskClient:
        client = client_for(app)
        client.environ_base["REMOTE_ADDR"] = address
        return client

    def browser(self, app: Flask | None = None) -> Browser:
        """A new browser on the user's machine."""
        return Browser(self._client(app or self.app, USER_IP))

    def account(self, username: str) -> str:
        with self.app.app_context(), db.transaction() as session:
            identity.create_user(session, SystemClock(), username=username, password=PASSWORD,
                                 actor="test")
        return username

    def logged_in(self, username: str) -> Browser:
        browser = self.browser()
        assert browser.log_in(username).status_code == 303
        return browser

    def user(self, username: str) -> str:
        """A local user's name in the audit trail."""
        return f"user:{username}@{self.settings.public_url}"

    @property
    def client_actor(self) -> str:
        return f"client:{self.server.id}"

    def cli(self, *args: str, env: Mapping[str, str | None] | None = None, stdin: str = "",
            code: int = 0) -> str:
        """Run a ``gateway`` command as the operator (``env``: changes, None unsets); its output."""
        changed = {**self.cli_environ, **(env or {})}
        result = self._run(*args, env={k: v for k, v in changed.items() if v is not None},
                           stdin=stdin)
        assert result.code == code, result.stderr
        return result.stdout

    # --- what they act on -----------------------------------------------------------------

    def link(self, username: str = "alice") -> str:
        """A new API-key elicitation for a local user; its id."""
        response = self.api.post("/api/v1/elicitations", {
            "subject": {"iss": self.settings.public_url, "sub": username}, "kind": "api_key",
            "credential_type": "generic", "message": "Connect your weather API key",
            "reuse_pending": False, "ttl_seconds": 900})
        assert response.status_code == 201, response.get_data(as_text=True)
        elicitation_id: str = response.get_json()["id"]
        return elicitation_id

    def submit(self, browser: Browser, elicitation_id: str, **form: str) -> None:
        answer = browser.post_form(f"/e/{elicitation_id}", form or {"action": "submit",
                                                                    "secret": KEY})
        assert answer.status_code == 200, answer.get_data(as_text=True)

    def credential(self) -> str:
        """A key alice stored for the MCP server; the credential's id."""
        self.submit(self.logged_in("alice"), self.link())
        [item] = self.api.get("/api/v1/credentials").get_json()["items"]
        credential_id: str = item["id"]
        return credential_id

    def outbox_event(self) -> str:
        """A webhook event waiting in the outbox; its id."""
        assert self.api.post(f"/api/v1/elicitations/{self.link()}/cancel").status_code == 200
        [event] = json.loads(self.cli("webhooks", "list", "--json"))
        event_id: str = event["id"]
        return event_id

    def oidc(self) -> tuple[Flask, OidcProvider]:
        """The gateway again, its users logging in at a real OpenID Connect provider."""
        provider: OidcProvider = self.request.getfixturevalue("oidc_provider")
        app = create_app(self._make_settings(
            GATEWAY_LOGIN_BACKEND="oidc", GATEWAY_OIDC_ISSUER=provider.issuer,
            GATEWAY_OIDC_CLIENT_ID=provider.client_id,
            GATEWAY_OIDC_CLIENT_SECRET=provider.client_secret,
            GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS=urlsplit(provider.issuer).netloc),
            clock=self.clock)
        self.request.addfinalizer(db.engine_of(app).dispose)
        return app, provider

    def oidc_callback(self, browser: Browser, provider: OidcProvider, username: str) -> str:
        """Log in at the provider; the path back to the gateway it redirects to."""
        start = browser.get("/login?next=/account")
        assert start.status_code == 303
        back = urlsplit(provider.login(new_session(), start.headers["Location"], username))
        return f"{back.path}?{back.query}"

    def oauth(self) -> tuple[Flask, OidcProvider, Api]:
        """The gateway again, with an OAuth type at a real provider; the MCP server's API there."""
        provider: OidcProvider = self.request.getfixturevalue("oidc_provider")
        tmp_path: Path = self.request.getfixturevalue("tmp_path")
        monkeypatch: pytest.MonkeyPatch = self.request.getfixturevalue("monkeypatch")
        monkeypatch.setenv("AUDIT_CONNECT_SECRET", provider.connect_client_secret)
        catalog = tmp_path / "oauth_types.toml"
        catalog.write_text(f'''[generic]\nlabel = "API key"\n[example]\nlabel = "Example"\n'''
                           f'''kind = "oauth"\n[example.oauth]\nissuer = "{provider.issuer}"\n'''
                           '''client_id = "connect-app"\nscopes = ["openid", "profile"]\n'''
                           '''client_secret_env = "AUDIT_CONNECT_SECRET"\n''')
        app = create_app(self._make_settings(
            GATEWAY_CREDENTIAL_TYPES_FILE=str(catalog),
            GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS=urlsplit(provider.issuer).netloc),
            clock=self.clock)
        self.request.addfinalizer(db.engine_of(app).dispose)
        return app, provider, Api(self._client(app, SERVER_IP), self.server.api_token)

    def provider_url(self, api: Api, browser: Browser, username: str) -> tuple[str, str]:
        """A connection asked of ``username``, started in ``browser``; its id and provider URL."""
        created = api.post("/api/v1/elicitations", {
            "subject": {"iss": self.settings.public_url, "sub": username}, "kind": "oauth",
            "credential_type": "example", "message": "Connect your Example account"})
        assert created.status_code == 201, created.get_data(as_text=True)
        page = f"/e/{created.get_json()['id']}"
        sent = browser.post_form(f"{page}/connect", {}, page=page)
        assert sent.status_code == 303, sent.get_data(as_text=True)
        return created.get_json()["id"], str(sent.headers["Location"])

    def connected(self) -> tuple[Flask, OidcProvider, Api, str]:
        """Alice's Example account, connected for the MCP server; the credential's id."""
        app, provider, api = self.oauth()
        browser = self.browser(app)
        assert browser.log_in("alice").status_code == 303
        _, url = self.provider_url(api, browser, "alice")
        back = urlsplit(provider.connect_login(url, "alice"))
        assert browser.get(f"{back.path}?{back.query}").status_code == 200
        [item] = api.get("/api/v1/credentials?type=example").get_json()["items"]
        credential_id: str = item["id"]
        return app, provider, api, credential_id

    # --- what was recorded ------------------------------------------------------------------

    def records(self, expected: Expected) -> list[AuditEvent]:
        """The records of the expected action on the expected target."""
        engine = db.make_engine(expected.database_url) if expected.database_url \
            else db.engine_of(self.app)
        target = AuditEvent.target == expected.target if expected.target is not None \
            else AuditEvent.target.is_(None)
        try:
            with Session(engine) as session:
                return list(session.scalars(select(AuditEvent).where(
                    AuditEvent.action == expected.action, target)))
        finally:
            if expected.database_url:
                engine.dispose()


@pytest.fixture
def world(request: pytest.FixtureRequest, app: Flask, settings: Settings, clock: FixedClock,
          register: Callable[..., Registered], invoke_gateway: Callable[..., Result],
          cli_environ: dict[str, str], make_settings: Callable[..., Settings]) -> World:
    """The MCP server "Weather MCP" and the local users alice and bob."""
    server = register("Weather MCP", webhook_url="https://mcp.example.com/hooks")
    created = World(request, app, settings, clock, server, invoke_gateway, cli_environ,
                    make_settings)
    created.account("alice")
    created.account("bob")
    return created


CASES: dict[str, Callable[[World], Expected]] = {}


def case(name: str) -> Callable[[Callable[[World], Expected]], Callable[[World], Expected]]:
    """Add a row: a function that does the action and says which record it leaves."""

    def add(act: Callable[[World], Expected]) -> Callable[[World], Expected]:
        CASES[name] = act
        return act

    return add


# --- logging in and out ------------------------------------------------------------------


@case("login, local account")
def _login(w: World) -> Expected:
    w.logged_in("alice")
    return Expected("login", w.user("alice"), "alice", USER_IP)


@case("login failure, local account")
def _login_failed(w: World) -> Expected:
    assert w.browser().log_in("alice", password="not-alices-password").status_code == 401
    return Expected("login.failed", f"anonymous@{USER_IP}", "alice", USER_IP, "failure")


@case("login, OpenID Connect")
def _oidc_login(w: World) -> Expected:
    app, provider = w.oidc()
    browser = w.browser(app)
    assert browser.get(w.oidc_callback(browser, provider, "carol")).status_code == 303
    return Expected("login", f"user:carol@{provider.issuer}", "carol", USER_IP)


@case("login failure, OpenID Connect")
def _oidc_login_failed(w: World) -> Expected:
    app, provider = w.oidc()
    browser = w.browser(app)
    tampered = w.oidc_callback(browser, provider, "carol").replace("state=", "state=x")
    assert browser.get(tampered).status_code == 400
    return Expected("login.failed", f"anonymous@{USER_IP}", None, USER_IP, "failure")


@case("logout")
def _logout(w: World) -> Expected:
    assert w.logged_in("alice").post_form("/logout", {}).status_code == 303
    return Expected("logout", w.user("alice"), "alice", USER_IP)


@case("identity mismatch: a forwarded link")
def _identity_mismatch(w: World) -> Expected:
    elicitation_id = w.link("alice")
    assert w.logged_in("bob").get(f"/e/{elicitation_id}").status_code == 403
    return Expected("identity_mismatch", w.user("bob"), elicitation_id, USER_IP, "denied")


# --- the elicitation's life ------------------------------------------------------------------


@case("elicitation created")
def _created(w: World) -> Expected:
    return Expected("elicitation.created", w.client_actor, w.link(), SERVER_IP)


@case("elicitation opened")
def _opened(w: World) -> Expected:
    elicitation_id = w.link()
    assert w.logged_in("alice").get(f"/e/{elicitation_id}").status_code == 200
    return Expected("elicitation.opened", w.user("alice"), elicitation_id, USER_IP)


@case("elicitation completed")
def _completed(w: World) -> Expected:
    elicitation_id = w.link()
    w.submit(w.logged_in("alice"), elicitation_id)
    return Expected("elicitation.completed", w.user("alice"), elicitation_id, USER_IP)


@case("elicitation declined")
def _declined(w: World) -> Expected:
    elicitation_id = w.link()
    w.submit(w.logged_in("alice"), elicitation_id, action="decline")
    return Expected("elicitation.declined", w.user("alice"), elicitation_id, USER_IP)


@case("elicitation cancelled by its MCP server")
def _cancelled_by_client(w: World) -> Expected:
    elicitation_id = w.link()
    assert w.api.post(f"/api/v1/elicitations/{elicitation_id}/cancel").status_code == 200
    return Expected("elicitation.cancelled", w.client_actor, elicitation_id, SERVER_IP)


@case("elicitation cancelled by the operator")
def _cancelled_by_operator(w: World) -> Expected:
    elicitation_id = w.link()
    w.cli("elicitations", "cancel", elicitation_id)
    return Expected("elicitation.cancelled", OPERATOR, elicitation_id, None)


@case("elicitation expired")
def _expired(w: World) -> Expected:
    elicitation_id = w.link()
    w.clock.advance(seconds=901)
    answer = w.api.get(f"/api/v1/elicitations/{elicitation_id}").get_json()
    assert answer["status"] == "expired"
    return Expected("elicitation.expired", "system:expiry", elicitation_id, None)


# --- secrets -------------------------------------------------------------------------------


@case("secret captured")
def _captured(w: World) -> Expected:
    return Expected("credential.captured", w.user("alice"), w.credential(), USER_IP)


@case("secret revealed")
def _revealed(w: World) -> Expected:
    credential_id = w.credential()
    assert w.api.post(f"/api/v1/credentials/{credential_id}/reveal").status_code == 200
    return Expected("credential.revealed", w.client_actor, credential_id, SERVER_IP)


@case("credential revoked by its MCP server")
def _revoked_by_client(w: World) -> Expected:
    credential_id = w.credential()
    revoked = w.api.client.delete(f"/api/v1/credentials/{credential_id}",
                                  headers=w.api.headers())
    assert revoked.status_code == 200
    return Expected("credential.revoked", w.client_actor, credential_id, SERVER_IP)


@case("credential revoked by its user")
def _revoked_by_user(w: World) -> Expected:
    credential_id = w.credential()
    revoked = w.logged_in("alice").post_form(f"/account/credentials/{credential_id}/revoke",
                                             {}, page="/account")
    assert revoked.status_code == 303
    return Expected("credential.revoked", w.user("alice"), credential_id, USER_IP)


@case("credential revoked by the operator")
def _revoked_by_operator(w: World) -> Expected:
    credential_id = w.credential()
    w.cli("credentials", "revoke", credential_id)
    return Expected("credential.revoked", OPERATOR, credential_id, None)


@case("credential replaced by a new key from its user")
def _superseded(w: World) -> Expected:
    replaced = w.credential()
    w.credential()
    return Expected("credential.revoked", w.user("alice"), replaced, USER_IP)


@case("revoked credentials purged")
def _purged(w: World) -> Expected:
    w.cli("credentials", "purge", "--revoked-older-than", "30d")
    return Expected("credential.purged", OPERATOR, None, None)


# --- keys ----------------------------------------------------------------------------------


@case("key rotation, keyring in the environment")
def _rotated_in_environment(w: World) -> Expected:
    w.cli("keys", "rotate")
    return Expected("keys.rotated", OPERATOR, "v2", None)


@case("key rotation, keyring file")
def _rotated(w: World) -> Expected:
    keyring = Path(w.cli_environ["GATEWAY_INSTANCE_PATH"]) / "keyring"
    keyring.write_text(TEST_KEYRING + "\n")
    keyring.chmod(0o600)
    w.cli("keys", "rotate", env={"GATEWAY_ENCRYPTION_KEYS": None})
    return Expected("keys.rotated", OPERATOR, "v2", None)


@case("secrets rewrapped to the new key")
def _rewrapped(w: World) -> Expected:
    w.cli("keys", "rewrap", env={"GATEWAY_ENCRYPTION_KEYS": f"{NEW_KEY},{TEST_KEYRING}"})
    return Expected("keys.rewrapped", OPERATOR, "v2", None)


@case("old key retired")
def _retired(w: World) -> Expected:
    both = {"GATEWAY_ENCRYPTION_KEYS": f"{NEW_KEY},{TEST_KEYRING}"}
    w.cli("keys", "rewrap", env=both)
    w.cli("keys", "retire", "v1", env=both)
    return Expected("keys.retired", OPERATOR, "v1", None)


# --- clients and users ------------------------------------------------------------------------


@case("client created")
def _client_created(w: World) -> Expected:
    minted = json.loads(w.cli("clients", "create", "Billing MCP", "--json"))
    return Expected("client.created", OPERATOR, minted["client_id"], None)


@case("client token added")
def _token_added(w: World) -> Expected:
    w.cli("clients", "rotate-token", w.server.id)
    return Expected("client.token_added", OPERATOR, w.server.id, None)


@case("client token revoked")
def _token_revoked(w: World) -> Expected:
    [token] = json.loads(w.cli("clients", "show", w.server.id, "--json"))["tokens"]
    w.cli("clients", "revoke-token", w.server.id, token["token_id"])
    return Expected("client.token_revoked", OPERATOR, w.server.id, None)


@case("client webhook secret rotated")
def _webhook_secret_rotated(w: World) -> Expected:
    w.cli("clients", "rotate-webhook-secret", w.server.name)
    return Expected("client.webhook_secret_rotated", OPERATOR, w.server.id, None)


@case("client webhook URL changed")
def _webhook_url_changed(w: World) -> Expected:
    w.cli("clients", "set-webhook-url", w.server.id, "https://mcp.example.com/moved")
    return Expected("client.webhook_url_changed", OPERATOR, w.server.id, None)


@case("client disabled")
def _client_disabled(w: World) -> Expected:
    w.cli("clients", "disable", w.server.id)
    return Expected("client.disabled", OPERATOR, w.server.id, None)


@case("user created")
def _user_created(w: World) -> Expected:
    w.cli("users", "create", "carol", "--password-stdin", stdin=f"{PASSWORD}\n")
    return Expected("user.created", OPERATOR, "carol", None)


@case("user disabled")
def _user_disabled(w: World) -> Expected:
    w.cli("users", "disable", "alice")
    return Expected("user.disabled", OPERATOR, "alice", None)


@case("user password reset")
def _password_reset(w: World) -> Expected:
    w.cli("users", "reset-password", "alice", "--password-stdin",
          stdin="a-new-long-passphrase-for-alice\n")
    return Expected("user.password_reset", OPERATOR, "alice", None)


@case("user's sessions ended")
def _sessions_ended(w: World) -> Expected:
    w.cli("users", "end-sessions", "alice")
    return Expected("user.sessions_ended", OPERATOR, "alice", None)


# --- webhooks and the schema -------------------------------------------------------------------


@case("webhook redelivered")
def _redelivered(w: World) -> Expected:
    event_id = w.outbox_event()
    w.cli("webhooks", "redeliver", event_id)
    return Expected("webhook.redelivered", OPERATOR, event_id, None)


@case("webhook test sent, and failed")
def _webhook_tested(w: World) -> Expected:
    nobody = f"127.0.0.1:{free_port()}"  # nothing listens: the test ping fails
    env = {"GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": nobody}
    minted = json.loads(w.cli("clients", "create", "Hooked MCP", "--webhook-url",
                              f"http://{nobody}/hooks", "--json", env=env))
    w.cli("webhooks", "test", minted["client_id"], env=env, code=1)
    return Expected("webhook.tested", OPERATOR, minted["client_id"], None, "failure")


@case("database schema upgraded")
def _schema_upgraded(w: World) -> Expected:
    empty: str = w.request.getfixturevalue("empty_database_url")
    w.cli("db", "upgrade", env={"GATEWAY_DATABASE_URL": empty})
    head = ", ".join(sorted(migrations.head_revisions()))
    return Expected("db.upgraded", OPERATOR, head, None, database_url=empty)


def now(clock: FixedClock) -> tuple[datetime, datetime]:
    """The earlier and the later of the app's clock and the real one."""
    moments = sorted([clock.now(), datetime.now(UTC)])
    return moments[0], moments[1]


# --- OAuth connections ------------------------------------------------------------------------


@case("connection started at the provider")
def _connect_started(w: World) -> Expected:
    app, _, api = w.oauth()
    browser = w.browser(app)
    assert browser.log_in("alice").status_code == 303
    elicitation_id, _ = w.provider_url(api, browser, "alice")
    return Expected("oauth.authorize", w.user("alice"), elicitation_id, USER_IP)


@case("identity mismatch: a forwarded provider URL")
def _connect_forwarded(w: World) -> Expected:
    app, provider, api = w.oauth()
    alices, bobs = w.browser(app), w.browser(app)
    assert alices.log_in("alice").status_code == 303
    elicitation_id, url = w.provider_url(api, alices, "alice")
    back = urlsplit(provider.connect_login(url, "bob"))
    assert bobs.log_in("bob").status_code == 303
    assert bobs.get(f"{back.path}?{back.query}").status_code == 403
    return Expected("identity_mismatch", w.user("bob"), elicitation_id, USER_IP, "denied")


@case("connection refreshed on a reveal")
def _connection_refreshed(w: World) -> Expected:
    _, _, api, credential_id = w.connected()
    w.clock.advance(seconds=290)  # the provider's tokens live 300 s
    assert api.post(f"/api/v1/credentials/{credential_id}/reveal").status_code == 200
    return Expected("credential.refreshed", w.client_actor, credential_id, SERVER_IP)


@case("connection revoked when its provider refuses the refresh")
def _connection_refresh_refused(w: World) -> Expected:
    _, provider, api, credential_id = w.connected()
    provider.set_connect(token_fault="invalid_grant")
    w.clock.advance(seconds=290)
    assert api.post(f"/api/v1/credentials/{credential_id}/reveal").status_code == 409
    return Expected("credential.revoked", w.client_actor, credential_id, SERVER_IP)


@pytest.mark.parametrize("act", CASES.values(), ids=CASES.keys())
def test_the_action_leaves_one_record_saying_who_what_target_where_and_outcome(
    world: World, clock: FixedClock, act: Callable[[World], Expected],
) -> None:
    started, _ = now(clock)
    expected = act(world)
    _, finished = now(clock)
    [record] = world.records(expected)
    assert (record.actor, record.action, record.target, record.source_ip, record.outcome) == (
        expected.actor, expected.action, expected.target, expected.source_ip,
        expected.outcome)
    assert record.occurred_at.utcoffset() == timedelta(0)
    assert started <= record.occurred_at <= finished


def test_an_answer_to_no_session_is_counted_not_recorded(world: World) -> None:
    # Anyone can send a provider's return to a browser signed in to nobody: a
    # record for each would let them fill the append-only trail. /metrics and
    # the log count them instead.
    app, provider, api = world.oauth()
    alices = world.browser(app)
    assert alices.log_in("alice").status_code == 303
    _, url = world.provider_url(api, alices, "alice")
    back = urlsplit(provider.connect_login(url, "alice"))
    for _ in range(3):
        assert world.browser(app).get(f"{back.path}?{back.query}").status_code == 400
    assert world.records(Expected("oauth.callback_refused", f"anonymous@{USER_IP}", None,
                                  USER_IP, "denied")) == []
    metrics = client_for(app).get("/metrics").get_data(as_text=True)  # from loopback
    assert 'gateway_oauth_callbacks_refused_total{reason="no-session"} 3.0' in metrics


# --- what an operator reads ----------------------------------------------------------------

FORGED = "mallory\n2026-12-02T00:00:00.000Z  operator:root  keys.retired  v1  -  success"


def test_user_supplied_text_cannot_forge_a_line_of_the_audit_listing(world: World) -> None:
    assert world.browser().log_in(FORGED).status_code == 401
    world.cli("clients", "create", FORGED, code=1)  # names with line breaks are refused
    world.cli("users", "create", FORGED, "--password-stdin", stdin=f"{PASSWORD}\n", code=1)
    records = json.loads(world.cli("audit", "--json"))
    header, *lines = world.cli("audit").splitlines()
    assert header.split() == ["TIME", "ACTOR", "ACTION", "TARGET", "SOURCE_IP", "OUTCOME"]
    assert len(lines) == len(records)  # one line per record, whatever was typed
    assert [line.split()[2] for line in lines] == [r["action"] for r in records]
    assert not any(line.startswith("2026-12-02T00:00:00.000Z") for line in lines)
    [failed] = [line for line in lines if "login.failed" in line]
    assert "mallory\\n2026-12-02T00:00:00.000Z" in failed
    assert [r["target"] for r in records if r["action"] == "login.failed"] == [FORGED[:64]]


def test_filters_narrow_the_listing_to_a_target_and_an_outcome(world: World) -> None:
    elicitation_id = world.link("alice")
    assert world.logged_in("bob").get(f"/e/{elicitation_id}").status_code == 403
    assert world.browser().log_in("bob", password="not-bobs-password").status_code == 401
    history = json.loads(world.cli("audit", "--json", "--target", elicitation_id))
    assert [r["action"] for r in history] == ["elicitation.created", "identity_mismatch"]
    refused = json.loads(world.cli("audit", "--json", "--outcome", "denied"))
    assert [(r["action"], r["actor"]) for r in refused] == [
        ("identity_mismatch", world.user("bob"))]
    failed = world.cli("audit", "--outcome", "failure").splitlines()
    assert len(failed) == 2
    assert "login.failed" in failed[1]
    assert world.cli("audit", "--outcome", "nonsense", code=2) == ""
