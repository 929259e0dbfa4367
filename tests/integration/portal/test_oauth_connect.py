"""Connecting a third-party account, against a real authorization server.

The provider in tests/oidc plays the third party (``connect-app``): the
gateway's connect page sends the browser there, the test logs in and allows
at the provider, and brings the redirect back to ``/oauth/callback/example``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from flask import Flask
from sqlalchemy import select

from gateway import db, preflight
from gateway.audit.models import AuditEvent
from gateway.credentials.models import Credential
from gateway.elicitations.models import Elicitation
from gateway.identity.web import LOCKOUT_EXTENSION
from gateway.oauth.models import OAuthState
from gateway.oauth.tokens import reveal_token_set
from gateway.settings import Settings
from gateway.vault.keyring import current_keyring
from gateway.webhooks.models import WebhookEvent
from gateway.worker import sweep
from tests.conftest import Api
from tests.integration.portal.conftest import Browser
from tests.oidc.fixtures import OidcProvider, new_session

SECRET_ENV = "TEST_CONNECT_CLIENT_SECRET"
TYPE = "example"


def catalog_text(provider: OidcProvider, **oauth: Any) -> str:
    """A catalog with the generic key type and one OAuth type at the test provider."""
    table = {"issuer": provider.issuer, "client_id": provider.connect_client_id,
             "client_secret_env": SECRET_ENV, "scopes": ["openid", "profile", "repo"],
             "account_field": "preferred_username", **oauth}
    lines = ['[generic]', 'label = "API key"', "", f"[{TYPE}]", 'label = "Example account"',
             'kind = "oauth"', "", f"[{TYPE}.oauth]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in table.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture
def settings(make_settings: Callable[..., Settings], oidc_provider: OidcProvider,
             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    catalog = tmp_path / "credential_types.toml"
    catalog.write_text(catalog_text(oidc_provider))
    monkeypatch.setenv(SECRET_ENV, oidc_provider.connect_client_secret)
    return make_settings(
        GATEWAY_CREDENTIAL_TYPES_FILE=str(catalog),
        GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS=urlsplit(oidc_provider.issuer).netloc)


@pytest.fixture
def connection_for(api: Api, settings: Settings) -> Callable[..., dict[str, Any]]:
    """Create an OAuth elicitation for a local user, as their MCP server would."""

    def make(username: str, **changes: Any) -> dict[str, Any]:
        response = api.post("/api/v1/elicitations", {
            "subject": {"iss": settings.public_url, "sub": username}, "kind": "oauth",
            "credential_type": TYPE, "message": "Connect your Example account",
            "reuse_pending": False, **changes})
        assert response.status_code == 201, response.get_data(as_text=True)
        created: dict[str, Any] = response.get_json()
        return created

    return make


def start(user: Browser, elicitation_id: str) -> str:
    """Open the connect page and press Connect: where the gateway sends the browser."""
    page = user.get(f"/e/{elicitation_id}")
    assert page.status_code == 200, page.get_data(as_text=True)
    sent = user.post_form(f"/e/{elicitation_id}/connect", {}, page=f"/e/{elicitation_id}")
    assert sent.status_code == 303, sent.get_data(as_text=True)
    return sent.headers["Location"]


def path_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}"


def rows(app: Flask, model: Any, *where: Any) -> list[Any]:
    with app.app_context():
        return list(db.session().scalars(select(model).where(*where)))


def status_of(app: Flask, elicitation_id: str) -> str:
    [found] = rows(app, Elicitation, Elicitation.id == elicitation_id)
    return str(found.status)


@pytest.fixture
def alices(browser: Callable[[], Browser], alice: str) -> Browser:
    user = browser()
    user.log_in(alice)
    return user


def test_the_connect_page_says_who_asks_for_what_and_where(
    alices: Browser, connection_for: Callable[..., dict[str, Any]], oidc_provider: OidcProvider,
) -> None:
    link = connection_for("alice", scopes=["openid", "repo"])
    page = alices.get(f"/e/{link['id']}")
    text = page.get_data(as_text=True)
    host = urlsplit(oidc_provider.issuer).netloc
    assert "Example account" in text
    assert f"Connect at {host}" in text
    assert "<code>repo</code>" in text
    assert "Connect your Example account" in text
    # The button's redirect goes to the provider: the CSP lets this page's form go there.
    assert f"form-action 'self' {urlsplit(oidc_provider.issuer).scheme}://{host}" in \
        page.headers["Content-Security-Policy"]


def test_connecting_stores_the_granted_tokens_and_completes(
    app: Flask, alices: Browser, connection_for: Callable[..., dict[str, Any]],
    oidc_provider: OidcProvider, register: Any,
) -> None:
    link = connection_for("alice")
    authorize = start(alices, link["id"])
    query = parse_qs(urlsplit(authorize).query)
    assert query["response_type"] == ["code"]
    assert query["code_challenge_method"] == ["S256"]
    assert len(query["state"][0]) >= 43  # 256 random bits
    assert "nonce" in query  # the type asks for openid
    assert link["id"] not in authorize  # the provider learns nothing of the link
    back = oidc_provider.connect_login(authorize, "alice")
    done = alices.get(path_of(back))
    text = done.get_data(as_text=True)
    assert done.status_code == 200, text
    assert "is connected" in text
    assert "alice" in text
    assert status_of(app, link["id"]) == "completed"
    [credential] = rows(app, Credential)
    assert credential.kind == "oauth"
    assert credential.account == "alice"
    assert credential.scopes == ["openid", "profile", "repo"]
    assert credential.token_expires_at is not None
    with app.app_context():
        tokens = reveal_token_set(current_keyring(), credential)
    assert tokens.refresh_token
    # The token works at the provider's API.
    who = new_session().get(f"{oidc_provider.issuer}/api/user", timeout=10,
                            headers={"Authorization": f"Bearer {tokens.access_token}"})
    assert who.json()["preferred_username"] == "alice"
    assert oidc_provider.connect_stats()["token_calls"]["authorization_code"] == 1


def test_the_webhook_tells_account_and_scopes_never_a_token(
    app: Flask, browser: Callable[[], Browser], alice: str, register: Any, settings: Settings,
    client: Any, oidc_provider: OidcProvider,
) -> None:
    registered = register(webhook_url="https://mcp.example.test/hooks")
    api = Api(client, registered.api_token)
    created = api.post("/api/v1/elicitations", {
        "subject": {"iss": settings.public_url, "sub": "alice"}, "kind": "oauth",
        "credential_type": TYPE, "message": "Connect", "scopes": ["openid", "repo"]}).get_json()
    oidc_provider.set_connect(grant_only=["repo"])
    user = browser()
    user.log_in(alice)
    back = oidc_provider.connect_login(start(user, created["id"]), "alice")
    page = user.get(path_of(back)).get_data(as_text=True)
    assert "is connected" in page
    [event] = rows(app, WebhookEvent, WebhookEvent.type == "elicitation.completed")
    data = json.loads(event.body)["data"]
    assert data["credential"]["scopes"] == ["openid", "repo"]
    assert data["credential"]["missing_scopes"] == []
    [credential] = rows(app, Credential)
    with app.app_context():
        tokens = reveal_token_set(current_keyring(), credential)
    assert tokens.access_token not in event.body
    assert tokens.refresh_token not in event.body


def test_narrower_scopes_are_stored_as_granted_and_said(
    app: Flask, alices: Browser, connection_for: Callable[..., dict[str, Any]],
    oidc_provider: OidcProvider,
) -> None:
    link = connection_for("alice", scopes=["openid", "profile", "repo"])
    oidc_provider.set_connect(grant_only=["profile"])
    back = oidc_provider.connect_login(start(alices, link["id"]), "alice")
    page = alices.get(path_of(back)).get_data(as_text=True)
    assert "did not grant every permission" in page
    assert "<code>repo</code>" in page
    [credential] = rows(app, Credential)
    assert "repo" not in (credential.scopes or [])


def test_alices_provider_url_finished_in_bobs_browser_stores_nothing(
    app: Flask, alices: Browser, browser: Callable[[], Browser], bob: str,
    connection_for: Callable[..., dict[str, Any]], oidc_provider: OidcProvider,
) -> None:
    link = connection_for("alice")
    authorize = start(alices, link["id"])
    # Bob finishes at the provider with his own account and comes back in his browser.
    back = oidc_provider.connect_login(authorize, "bob")
    bobs = browser()
    bobs.log_in(bob)
    refused = bobs.get(path_of(back))
    assert refused.status_code == 403
    assert "created for another account" in refused.get_data(as_text=True)
    assert rows(app, Credential) == []
    assert status_of(app, link["id"]) == "opened"
    [mismatch] = rows(app, AuditEvent, AuditEvent.action == "identity_mismatch")
    assert mismatch.target == link["id"]
    assert "bob" in mismatch.actor
    # The code was never exchanged, and Alice's own return still works.
    assert oidc_provider.connect_stats()["token_calls"].get("authorization_code", 0) == 0
    assert alices.get(path_of(back)).status_code == 200
    assert status_of(app, link["id"]) == "completed"


def test_a_return_without_a_session_is_refused(
    app: Flask, alices: Browser, browser: Callable[[], Browser],
    connection_for: Callable[..., dict[str, Any]], oidc_provider: OidcProvider,
) -> None:
    link = connection_for("alice")
    back = oidc_provider.connect_login(start(alices, link["id"]), "alice")
    stranger = browser()
    refused = stranger.get(path_of(back))
    assert refused.status_code == 400
    assert "not signed in" in refused.get_data(as_text=True)
    assert rows(app, Credential) == []
    # Counted in /metrics and the log, not audited: anyone can send one.
    assert rows(app, AuditEvent, AuditEvent.action == "oauth.callback_refused") == []


def test_a_code_is_exchanged_once_and_a_state_used_once(
    app: Flask, alices: Browser, connection_for: Callable[..., dict[str, Any]],
    oidc_provider: OidcProvider,
) -> None:
    link = connection_for("alice")
    back = oidc_provider.connect_login(start(alices, link["id"]), "alice")
    assert alices.get(path_of(back)).status_code == 200
    replayed = alices.get(path_of(back))
    assert replayed.status_code == 400
    assert "used already" in replayed.get_data(as_text=True)
    assert oidc_provider.connect_stats()["token_calls"]["authorization_code"] == 1
    assert len(rows(app, Credential)) == 1


def test_unknown_state_is_refused(alices: Browser, app: Flask) -> None:
    refused = alices.get("/oauth/callback/example?code=abc&state=made-up")
    assert refused.status_code == 400
    assert "does not belong" in refused.get_data(as_text=True)
    assert rows(app, Credential) == []


def test_access_denied_declines(
    app: Flask, alices: Browser, connection_for: Callable[..., dict[str, Any]],
    oidc_provider: OidcProvider,
) -> None:
    link = connection_for("alice")
    back = oidc_provider.connect_login(start(alices, link["id"]), "alice", deny=True)
    assert "error=access_denied" in back
    page = alices.get(path_of(back))
    assert "You declined" in page.get_data(as_text=True)
    assert status_of(app, link["id"]) == "declined"
    assert rows(app, Credential) == []


def test_another_provider_error_leaves_the_link_open(
    app: Flask, alices: Browser, connection_for: Callable[..., dict[str, Any]],
    oidc_provider: OidcProvider,
) -> None:
    link = connection_for("alice")
    authorize = start(alices, link["id"])
    state = parse_qs(urlsplit(authorize).query)["state"][0]
    # As the provider would send it: with its issuer (RFC 9207 covers error responses too).
    page = alices.get("/oauth/callback/example?" + urlencode({
        "error": "temporarily_unavailable", "state": state, "iss": oidc_provider.issuer}))
    assert page.status_code == 400
    text = page.get_data(as_text=True)
    assert "busy just now" in text
    assert "Connect at" in text  # the button is there again
    assert status_of(app, link["id"]) == "opened"


@pytest.mark.parametrize(("fault", "said"), [
    ("html", "not JSON"), ("oversize", "too large"), ("missing_access_token", "without an access"),
    ("server_error", "HTTP 503"), ("invalid_grant", "refused: invalid_grant"),
])
def test_a_bad_token_answer_stores_nothing_and_says_why(
    app: Flask, alices: Browser, connection_for: Callable[..., dict[str, Any]],
    oidc_provider: OidcProvider, fault: str, said: str,
) -> None:
    link = connection_for("alice")
    back = oidc_provider.connect_login(start(alices, link["id"]), "alice")
    oidc_provider.set_connect(token_fault=fault)
    page = alices.get(path_of(back))
    assert page.status_code == 400
    text = page.get_data(as_text=True)
    assert said in text
    assert "Nothing was stored" in text
    assert rows(app, Credential) == []
    assert status_of(app, link["id"]) == "opened"


def test_a_refused_client_at_the_exchange_is_recorded_for_gateway_status(
    app: Flask, alices: Browser, connection_for: Callable[..., dict[str, Any]],
    oidc_provider: OidcProvider,
) -> None:
    link = connection_for("alice")
    back = oidc_provider.connect_login(start(alices, link["id"]), "alice")
    oidc_provider.set_connect(token_fault="invalid_client")
    page = alices.get(path_of(back))
    assert page.status_code == 400
    assert "invalid_client" in page.get_data(as_text=True)
    assert rows(app, Credential) == []
    [refused] = rows(app, AuditEvent, AuditEvent.action == "oauth.client_refused")
    assert (refused.target, refused.outcome) == ("example", "failure")
    assert refused.details == {"elicitation_id": link["id"], "provider_error": "invalid_client"}


def test_a_slow_provider_times_out_and_stores_nothing(
    app: Flask, settings: Settings, alices: Browser,
    connection_for: Callable[..., dict[str, Any]], oidc_provider: OidcProvider,
) -> None:
    Path(settings.credential_types_file or "").write_text(
        catalog_text(oidc_provider, timeout_seconds=1))
    app.extensions.pop("gateway.catalog", None)
    link = connection_for("alice")
    back = oidc_provider.connect_login(start(alices, link["id"]), "alice")
    oidc_provider.set_connect(token_fault="slow", slow_seconds=3)
    page = alices.get(path_of(back))
    assert "no answer in time" in page.get_data(as_text=True)
    assert rows(app, Credential) == []


def test_expired_link_refuses_the_return(
    app: Flask, alices: Browser, connection_for: Callable[..., dict[str, Any]],
    oidc_provider: OidcProvider, clock: Any,
) -> None:
    link = connection_for("alice", ttl_seconds=60)
    back = oidc_provider.connect_login(start(alices, link["id"]), "alice")
    clock.advance(seconds=61)
    page = alices.get(path_of(back))
    assert page.status_code == 400
    assert rows(app, Credential) == []
    assert oidc_provider.connect_stats()["token_calls"].get("authorization_code", 0) == 0


def test_states_are_stored_as_digests(
    app: Flask, alices: Browser, connection_for: Callable[..., dict[str, Any]],
) -> None:
    link = connection_for("alice")
    state = parse_qs(urlsplit(start(alices, link["id"])).query)["state"][0]
    [row] = rows(app, OAuthState)
    assert row.digest != state
    assert state not in row.digest


def test_reconnecting_supersedes_the_previous_connection(
    app: Flask, alices: Browser, connection_for: Callable[..., dict[str, Any]],
    oidc_provider: OidcProvider,
) -> None:
    for _ in range(2):
        link = connection_for("alice")
        back = oidc_provider.connect_login(start(alices, link["id"]), "alice")
        assert alices.get(path_of(back)).status_code == 200
    credentials = rows(app, Credential)
    assert len(credentials) == 2
    assert sorted(c.revoked_reason or "live" for c in credentials) == ["live", "superseded"]



def test_the_account_page_lists_the_connection_beside_keys(
    app: Flask, alices: Browser, connection_for: Callable[..., dict[str, Any]],
    oidc_provider: OidcProvider,
) -> None:
    link = connection_for("alice", scopes=["openid", "repo"])
    back = oidc_provider.connect_login(start(alices, link["id"]), "alice")
    assert alices.get(path_of(back)).status_code == 200
    page = alices.get("/account").get_data(as_text=True)
    connected = page[page.index("Connected accounts"):]
    assert "Example account <code>alice</code>" in connected
    assert "<code>repo</code>" in connected
    assert "Disconnect" in connected
    assert "You have no stored keys." in page


def test_the_sweeper_forgets_the_states_of_expired_links(
    app: Flask, alices: Browser, connection_for: Callable[..., dict[str, Any]], clock: Any,
) -> None:
    start(alices, connection_for("alice", ttl_seconds=60)["id"])
    kept = connection_for("alice", ttl_seconds=600)
    start(alices, kept["id"])
    clock.advance(seconds=61)
    with app.app_context():
        sweep(app.extensions["gateway.engine"], clock, app.extensions[LOCKOUT_EXTENSION])
    [left] = rows(app, OAuthState)
    assert left.elicitation_id == kept["id"]


@pytest.mark.parametrize("fault", ["wrong_nonce", "bad_signature", "wrong_audience", "expired",
                                   "wrong_azp"])
def test_an_id_token_that_does_not_check_out_stores_nothing(
    app: Flask, alices: Browser, connection_for: Callable[..., dict[str, Any]],
    oidc_provider: OidcProvider, fault: str,
) -> None:
    link = connection_for("alice")
    back = oidc_provider.connect_login(start(alices, link["id"]), "alice")
    oidc_provider.set_fault(fault)
    page = alices.get(path_of(back))
    assert page.status_code == 400
    assert "ID token" in page.get_data(as_text=True)
    assert rows(app, Credential) == []
    assert status_of(app, link["id"]) == "opened"


def test_the_connect_page_has_the_portals_header_message_block_and_expiry(
    alices: Browser, connection_for: Callable[..., dict[str, Any]],
) -> None:
    link = connection_for("alice", message="Connect <b>now</b>")
    text = alices.get(f"/e/{link['id']}").get_data(as_text=True)
    assert '<a href="/account">Your keys</a>' in text
    assert '<button type="submit" class="link">Log out</button>' in text
    assert '<h2 id="app-message-heading">Message from mcp-server-1</h2>' in text
    assert "<blockquote>Connect &lt;b&gt;now&lt;/b&gt;</blockquote>" in text
    assert f'<time datetime="{link["expires_at"]}" data-local-time>' in text


# --- provider URLs: one rule for the catalog and discovery ------------------------------


@pytest.mark.parametrize(("endpoint", "said"), [
    ("https://idp.example.com;frame-ancestors *;/authorize", "holds a character"),
    ("http://idp.example.com/authorize", "must be an https:// URL"),
])
def test_a_discovered_authorization_endpoint_that_breaks_the_url_rule_is_refused(
    alices: Browser, connection_for: Callable[..., dict[str, Any]],
    oidc_provider: OidcProvider, endpoint: str, said: str,
) -> None:
    oidc_provider.set_discovery(authorization_endpoint=endpoint)
    link = connection_for("alice")
    page = alices.get(f"/e/{link['id']}")
    text = page.get_data(as_text=True)
    assert f"its authorization_endpoint {said}" in text
    policy = page.headers["Content-Security-Policy"]
    assert "idp.example.com" not in policy
    assert "form-action 'self';" in policy
    assert "frame-ancestors 'none';" in policy
    assert "frame-ancestors *" not in policy
    # Pressing Connect anyway sends the browser nowhere.
    sent = alices.post_form(f"/e/{link['id']}/connect", {}, page=f"/e/{link['id']}")
    assert sent.status_code == 503
    assert "Location" not in sent.headers
    assert "its authorization_endpoint" in sent.get_data(as_text=True)


# --- OpenID answers: complete, or refused ------------------------------------------------


def revocations(provider: OidcProvider) -> list[tuple[str | None, int | None]]:
    """What connect-app's revocation requests found and answered."""
    return [(r["found"], r["status"]) for r in provider.connect_stats()["revocations"]]


def test_an_openid_answer_without_an_id_token_stores_nothing_and_revokes_its_tokens(
    app: Flask, alices: Browser, connection_for: Callable[..., dict[str, Any]],
    oidc_provider: OidcProvider,
) -> None:
    link = connection_for("alice")  # the type asks for openid
    back = oidc_provider.connect_login(start(alices, link["id"]), "alice")
    oidc_provider.set_connect(token_fault="no_id_token")
    page = alices.get(path_of(back))
    assert page.status_code == 400
    text = page.get_data(as_text=True)
    assert "without the ID token" in text
    assert "Nothing was stored" in text
    assert rows(app, Credential) == []
    assert status_of(app, link["id"]) == "opened"
    # The tokens the code bought are not left valid at the provider.
    assert revocations(oidc_provider)[0] == ("refresh_token", 200)
    [discarded] = rows(app, AuditEvent, AuditEvent.action == "oauth.tokens_discarded")
    assert discarded.target == link["id"]
    assert discarded.details["reason"] == "refused"


def test_a_discovery_without_s256_is_refused(
    app: Flask, settings: Settings, alices: Browser,
    connection_for: Callable[..., dict[str, Any]], oidc_provider: OidcProvider,
) -> None:
    oidc_provider.set_discovery(code_challenge_methods_supported=["plain"])
    link = connection_for("alice")
    text = alices.get(f"/e/{link['id']}").get_data(as_text=True)
    assert "does not list S256 in code_challenge_methods_supported" in text
    sent = alices.post_form(f"/e/{link['id']}/connect", {}, page=f"/e/{link['id']}")
    assert sent.status_code == 503
    # gateway serve refuses to start on it; gateway status says why.
    [problem] = preflight.oauth_problems(settings)
    assert problem.setting == "[example.oauth] issuer"
    assert "does not list S256" in problem.problem
    assert problem.refuses_start
    oidc_provider.set_discovery()
    assert preflight.oauth_problems(settings) == []


# --- loose ends: a short-lived state, and tokens that arrive too late --------------------


def test_a_state_lives_15_minutes_after_connect_whatever_the_links_life(
    app: Flask, alices: Browser, connection_for: Callable[..., dict[str, Any]],
    oidc_provider: OidcProvider, clock: Any,
) -> None:
    link = connection_for("alice", ttl_seconds=86400)
    back = oidc_provider.connect_login(start(alices, link["id"]), "alice")
    clock.advance(minutes=10)
    assert alices.get("/account").status_code == 200  # the session stays alive meanwhile
    clock.advance(minutes=5, seconds=1)
    page = alices.get(path_of(back))
    assert page.status_code == 400
    assert "took too long" in page.get_data(as_text=True)
    assert oidc_provider.connect_stats()["token_calls"].get("authorization_code", 0) == 0
    assert status_of(app, link["id"]) == "opened"  # Connect can be pressed again


def test_tokens_for_a_link_cancelled_during_the_exchange_are_revoked_not_stored(
    app: Flask, alices: Browser, api: Api, connection_for: Callable[..., dict[str, Any]],
    oidc_provider: OidcProvider,
) -> None:
    link = connection_for("alice")
    back = oidc_provider.connect_login(start(alices, link["id"]), "alice")
    # The provider spends the code at once and holds its answer back a moment.
    oidc_provider.set_connect(token_fault="slow", slow_seconds=2)
    with ThreadPoolExecutor(1) as pool:
        returned = pool.submit(alices.get, path_of(back))
        deadline = time.monotonic() + 10
        while not oidc_provider.connect_stats()["token_requests"]:
            assert time.monotonic() < deadline, "the code was never sent to the provider"
            time.sleep(0.05)
        cancelled = api.post(f"/api/v1/elicitations/{link['id']}/cancel", {})
        assert cancelled.status_code == 200, cancelled.get_data(as_text=True)
        page = returned.result(timeout=30)
    assert "This request was withdrawn" in page.get_data(as_text=True)
    assert rows(app, Credential) == []
    assert status_of(app, link["id"]) == "cancelled"
    assert revocations(oidc_provider)[0] == ("refresh_token", 200)
    [discarded] = rows(app, AuditEvent, AuditEvent.action == "oauth.tokens_discarded")
    assert discarded.details == {"reason": "link-ended",
                                 "provider_revocation": "revoked at the provider"}


def test_a_return_that_finds_its_link_completed_meanwhile_keeps_the_other_connection(
    app: Flask, alices: Browser, connection_for: Callable[..., dict[str, Any]],
    oidc_provider: OidcProvider,
) -> None:
    link = connection_for("alice")
    session = new_session()  # one browser at the provider: signed in once, one grant
    first = oidc_provider.connect_login(start(alices, link["id"]), "alice", session=session)
    second = oidc_provider.connect_login(start(alices, link["id"]), None, session=session)
    # The second tab's code is exchanged slowly; the first tab's return
    # completes the link meanwhile.
    oidc_provider.set_connect(token_fault="slow", slow_seconds=2)
    with ThreadPoolExecutor(1) as pool:
        late = pool.submit(alices.get, path_of(second))
        deadline = time.monotonic() + 10
        while not oidc_provider.connect_stats()["token_requests"]:
            assert time.monotonic() < deadline, "the code was never sent to the provider"
            time.sleep(0.05)
        oidc_provider.set_connect(token_fault=None)
        assert "is connected" in alices.get(path_of(first)).get_data(as_text=True)
        page = late.result(timeout=30).get_data(as_text=True)
    assert "This request is complete" in page
    assert "is connected" not in page
    [credential] = rows(app, Credential)
    assert status_of(app, link["id"]) == "completed"
    # The late tokens share the stored connection's grant at the provider:
    # revoking them would end it, so they are only dropped.
    assert revocations(oidc_provider) == []
    [discarded] = rows(app, AuditEvent, AuditEvent.action == "oauth.tokens_discarded")
    assert discarded.details["reason"] == "completed-by-another-return"
    with app.app_context():
        kept = reveal_token_set(current_keyring(), credential)
    assert oidc_provider.connect_refresh(kept.refresh_token).status_code == 200
