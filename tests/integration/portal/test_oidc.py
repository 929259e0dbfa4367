"""OpenID Connect login against a real provider, and every check of its answer."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from flask import Flask
from sqlalchemy import select

from gateway import db
from gateway.app import create_app
from gateway.audit.models import AuditEvent
from gateway.clock import FixedClock
from gateway.settings import Settings
from tests.conftest import Api, Registered, client_for
from tests.integration.conftest import Result
from tests.integration.portal.conftest import Browser
from tests.oidc.fixtures import OidcProvider, new_session


@pytest.fixture
def oidc_app(make_settings: Callable[..., Settings], oidc_provider: OidcProvider,
             clock: FixedClock) -> Iterator[Flask]:
    """A gateway whose users log in at the test provider."""
    host = urlsplit(oidc_provider.issuer).netloc
    settings = make_settings(
        GATEWAY_LOGIN_BACKEND="oidc", GATEWAY_OIDC_ISSUER=oidc_provider.issuer,
        GATEWAY_OIDC_CLIENT_ID=oidc_provider.client_id,
        GATEWAY_OIDC_CLIENT_SECRET=oidc_provider.client_secret,
        GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS=host)
    app = create_app(settings, clock=clock)
    yield app
    db.engine_of(app).dispose()


@pytest.fixture
def oidc_browser(oidc_app: Flask) -> Callable[[], Browser]:
    return lambda: Browser(client_for(oidc_app))


def start(browser: Browser, next_path: str = "/account") -> str:
    """The gateway's redirect to the provider."""
    response = browser.get(f"/login?next={next_path}")
    assert response.status_code == 303
    location: str = response.headers["Location"]
    return location


def callback_path(url: str) -> str:
    parts = urlsplit(url)
    assert parts.path == "/login/callback", url
    return f"{parts.path}?{parts.query}"


def log_in(browser: Browser, provider: OidcProvider, username: str,
           next_path: str = "/account") -> Any:
    callback = provider.login(new_session(), start(browser, next_path), username)
    return browser.get(callback_path(callback))


def failures(app: Flask) -> list[dict[str, Any]]:
    with app.app_context():
        return [event.details for event in db.session().scalars(
            select(AuditEvent).where(AuditEvent.action == "login.failed"))]


def signed_in_as(browser: Browser) -> str | None:
    text = browser.get("/logout").get_data(as_text=True)
    if "You are logged in as" not in text:
        return None
    return text.split("You are logged in as <strong>")[1].split("</strong>")[0]


def test_the_authorization_request_uses_pkce_state_and_nonce(
    oidc_browser: Callable[[], Browser], oidc_provider: OidcProvider,
) -> None:
    location = start(oidc_browser())
    assert location.startswith(oidc_provider.metadata()["authorization_endpoint"])
    query = parse_qs(urlsplit(location).query)
    assert query["code_challenge_method"] == ["S256"]
    assert query["response_type"] == ["code"]
    assert query["client_id"] == [oidc_provider.client_id]
    assert query["redirect_uri"] == ["https://gateway.test/login/callback"]
    assert len(query["state"][0]) >= 32
    assert len(query["nonce"][0]) >= 32
    assert len(query["code_challenge"][0]) == 43


def test_a_full_login_binds_the_session_to_iss_and_sub(
    oidc_app: Flask, oidc_browser: Callable[[], Browser], oidc_provider: OidcProvider,
) -> None:
    browser = oidc_browser()
    before = browser.session_cookie
    response = log_in(browser, oidc_provider, "alice")
    assert response.status_code == 303
    assert response.headers["Location"] == "/account"
    assert browser.session_cookie != before
    assert signed_in_as(browser) == "alice"
    with oidc_app.app_context():
        [event] = db.session().scalars(select(AuditEvent).where(
            AuditEvent.action == "login")).all()
    assert event.actor == f"user:alice@{oidc_provider.issuer}"


def test_a_tampered_state_is_refused(
    oidc_app: Flask, oidc_browser: Callable[[], Browser], oidc_provider: OidcProvider,
) -> None:
    browser = oidc_browser()
    callback = oidc_provider.login(new_session(), start(browser), "alice")
    tampered = callback.replace("state=", "state=x")
    response = browser.get(callback_path(tampered))
    assert response.status_code == 400
    assert "Login failed" in response.get_data(as_text=True)
    assert signed_in_as(browser) is None
    assert failures(oidc_app)[-1]["reason"] == "state-mismatch"


def test_a_callback_carried_to_another_browser_is_refused(
    oidc_app: Flask, oidc_browser: Callable[[], Browser], oidc_provider: OidcProvider,
) -> None:
    victim, attacker = oidc_browser(), oidc_browser()
    callback = oidc_provider.login(new_session(), start(victim), "alice")
    assert attacker.get(callback_path(callback)).status_code == 400
    assert signed_in_as(attacker) is None
    assert failures(oidc_app)[-1]["reason"] == "no-pending-login"


def test_a_replayed_authorization_code_is_refused(
    oidc_app: Flask, oidc_browser: Callable[[], Browser], oidc_provider: OidcProvider,
) -> None:
    first = oidc_browser()
    callback = oidc_provider.login(new_session(), start(first), "alice")
    assert first.get(callback_path(callback)).status_code == 303
    # The same answer again, in the same browser: the login it belonged to is over.
    assert first.get(callback_path(callback)).status_code == 400
    # The code with a fresh login's state: the provider refuses the used code.
    second = oidc_browser()
    fresh = parse_qs(urlsplit(start(second)).query)["state"][0]
    code = parse_qs(urlsplit(callback).query)["code"][0]
    replay = second.get(f"/login/callback?code={code}&state={fresh}")
    assert replay.status_code == 400
    assert "refused the login" in replay.get_data(as_text=True)
    assert signed_in_as(second) is None


@pytest.mark.parametrize(("fault", "reason"), [
    ("wrong_audience", "id-token-audience"),
    ("wrong_issuer", "id-token-issuer"),
    ("wrong_azp", "id-token-authorized-party"),
    ("bad_signature", "id-token-signature"),
    ("unknown_kid", "id-token-signature"),
    ("expired", "id-token-expiry"),
    ("wrong_nonce", "id-token-nonce"),
    ("missing_nonce", "id-token-nonce"),
    ("alg_none", "id-token-signature"),
    ("alg_hs256", "id-token-signature"),
])
def test_a_faulty_id_token_is_refused(
    oidc_app: Flask, oidc_browser: Callable[[], Browser], oidc_provider: OidcProvider,
    fault: str, reason: str,
) -> None:
    oidc_provider.set_fault(fault)
    browser = oidc_browser()
    response = log_in(browser, oidc_provider, "alice")
    assert response.status_code == 400
    assert signed_in_as(browser) is None
    assert failures(oidc_app)[-1]["reason"] == reason


def test_logout_ends_the_session(
    oidc_app: Flask, oidc_browser: Callable[[], Browser], oidc_provider: OidcProvider,
) -> None:
    browser = oidc_browser()
    log_in(browser, oidc_provider, "alice")
    copied = browser.session_cookie
    assert browser.post_form("/logout", {}, page="/logout").status_code == 303
    thief = oidc_browser()
    assert copied is not None
    thief.client.set_cookie("__Host-gateway_session", copied, domain="gateway.test")
    assert signed_in_as(thief) is None
    assert signed_in_as(browser) is None


def test_an_idle_session_expires(
    oidc_browser: Callable[[], Browser], oidc_provider: OidcProvider, clock: FixedClock,
) -> None:
    browser = oidc_browser()
    log_in(browser, oidc_provider, "alice")
    clock.advance(minutes=16)
    assert signed_in_as(browser) is None


def test_the_phishing_defence_holds_with_oidc(
    oidc_app: Flask, oidc_browser: Callable[[], Browser], oidc_provider: OidcProvider,
    register: Callable[..., Registered],
) -> None:
    api = Api(client_for(oidc_app), register().api_token)
    link = api.post("/api/v1/elicitations", {
        "subject": {"iss": oidc_provider.issuer, "sub": "alice"}, "kind": "api_key",
        "credential_type": "generic", "message": "Connect your key"}).get_json()
    bobs = oidc_browser()
    log_in(bobs, oidc_provider, "bob", next_path=f"/e/{link['id']}")
    assert bobs.get(f"/e/{link['id']}").status_code == 403
    assert api.get(f"/api/v1/elicitations/{link['id']}").get_json()["status"] == "pending"

    alices = oidc_browser()
    landed = log_in(alices, oidc_provider, "alice", next_path=f"/e/{link['id']}")
    assert landed.headers["Location"] == f"/e/{link['id']}"
    done = alices.post_form(f"/e/{link['id']}", {"action": "submit", "secret": "alice-key-42"})
    assert "This request is complete" in done.get_data(as_text=True)
    assert api.get(f"/api/v1/elicitations/{link['id']}").get_json()["status"] == "completed"


@pytest.mark.parametrize(("issuer", "allowed", "words"), [
    # Nothing listens there: an outage, worth another try.
    ("http://127.0.0.1:9", "127.0.0.1:9", "try again"),
    # Plain http to a host the outbound guard does not allow: a setting to fix.
    ("http://127.0.0.1:9", "", "operator"),
])
def test_a_provider_the_gateway_cannot_use_gets_a_clear_page(
    make_settings: Callable[..., Settings], issuer: str, allowed: str, words: str,
) -> None:
    app = create_app(make_settings(
        GATEWAY_LOGIN_BACKEND="oidc", GATEWAY_OIDC_ISSUER=issuer,
        GATEWAY_OIDC_CLIENT_ID="gateway", GATEWAY_OIDC_CLIENT_SECRET="not-used",
        GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS=allowed))
    response = client_for(app).get("/login?next=/account")
    page = response.get_data(as_text=True)
    assert response.status_code == 502
    assert "The identity provider did not answer" in page
    assert words in page
    db.engine_of(app).dispose()


def test_an_operator_ends_every_session_of_an_oidc_user(
    oidc_app: Flask, oidc_browser: Callable[[], Browser], oidc_provider: OidcProvider,
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str],
) -> None:
    laptop, phone, bobs = oidc_browser(), oidc_browser(), oidc_browser()
    for browser, username in ((laptop, "alice"), (phone, "alice"), (bobs, "bob")):
        log_in(browser, oidc_provider, username)
        assert signed_in_as(browser) == username
    environ = {**cli_environ, "GATEWAY_LOGIN_BACKEND": "oidc",
               "GATEWAY_OIDC_ISSUER": oidc_provider.issuer,
               "GATEWAY_OIDC_CLIENT_ID": oidc_provider.client_id,
               "GATEWAY_OIDC_CLIENT_SECRET": oidc_provider.client_secret}
    ended = invoke_gateway("users", "end-sessions", "alice", env=environ)
    assert ended.code == 0, ended.stderr
    assert ended.stdout == f"2 session(s) of alice at {oidc_provider.issuer} ended\n"
    assert signed_in_as(laptop) is None
    assert signed_in_as(phone) is None
    assert signed_in_as(bobs) == "bob"
    with oidc_app.app_context():
        [event] = db.session().scalars(select(AuditEvent).where(
            AuditEvent.action == "user.sessions_ended")).all()
    assert (event.target, event.details) == ("alice", {"iss": oidc_provider.issuer,
                                                       "sessions_ended": 2})


def test_ending_sessions_names_the_issuer_it_was_given(
    oidc_browser: Callable[[], Browser], oidc_provider: OidcProvider,
    invoke_gateway: Callable[..., Result],
) -> None:
    browser = oidc_browser()
    log_in(browser, oidc_provider, "alice")
    # The CLI's own backend is local here: the default issuer is another one.
    untouched = invoke_gateway("users", "end-sessions", "alice", "--json")
    assert json.loads(untouched.stdout)["sessions_ended"] == 0
    assert signed_in_as(browser) == "alice"
    ended = invoke_gateway("users", "end-sessions", "alice", "--iss", oidc_provider.issuer,
                           "--json")
    assert json.loads(ended.stdout) == {
        "subject": {"iss": oidc_provider.issuer, "sub": "alice"}, "sessions_ended": 1}
    assert signed_in_as(browser) is None
