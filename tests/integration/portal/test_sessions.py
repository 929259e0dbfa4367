"""Server-side sessions and local login: cookie flags, fixation, timeouts, logout, abuse."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import func, select

from gateway import db
from gateway.audit.models import AuditEvent
from gateway.clock import FixedClock, SystemClock
from gateway.identity import passwords
from gateway.identity import service as identity
from gateway.identity.models import BrowserSession, User
from tests.integration.portal.conftest import PASSWORD, Browser


def logged_in(browser: Browser) -> bool:
    """Whether the browser's session belongs to someone (the logout page says who)."""
    return "You are logged in as" in browser.get("/logout").get_data(as_text=True)


def session_rows(app: Flask) -> int:
    with app.app_context():
        return db.session().scalar(select(func.count()).select_from(BrowserSession)) or 0


def test_the_session_cookie_has_every_flag(browser: Callable[[], Browser], alice: str) -> None:
    response = browser().log_in(alice)
    assert response.status_code == 303
    [cookie] = [value for name, value in response.headers.items()
                if name == "Set-Cookie" and value.startswith("__Host-gateway_session=")]
    flags = [part.strip().lower() for part in cookie.split(";")[1:]]
    assert {"secure", "httponly", "samesite=lax", "path=/"} <= set(flags)
    assert not any(flag.startswith("domain") for flag in flags)
    token = cookie.split(";")[0].split("=", 1)[1]
    assert len(token) >= 43  # 256 random bits


def test_the_database_holds_only_a_digest_of_the_session_id(
    app: Flask, browser: Callable[[], Browser], alice: str,
) -> None:
    alices = browser()
    alices.log_in(alice)
    with app.app_context():
        rows = db.session().scalars(select(BrowserSession)).all()
    assert [row.subject_sub for row in rows] == ["alice"]
    assert alices.session_cookie not in (rows[0].digest, str(rows[0].data))


def test_the_cookie_before_login_does_not_authenticate_after_it(
    browser: Callable[[], Browser], app: Flask, alice: str,
) -> None:
    visitor = browser()
    visitor.get("/login")
    planted = visitor.session_cookie
    assert planted, "the login form's CSRF token needs a session"
    visitor.log_in(alice)
    assert visitor.session_cookie != planted
    attacker = browser()
    attacker.client.set_cookie("__Host-gateway_session", planted, domain="gateway.test")
    assert not logged_in(attacker)
    assert logged_in(visitor)


def test_logout_deletes_the_session_so_a_copied_cookie_stops_working(
    app: Flask, browser: Callable[[], Browser], alice: str,
) -> None:
    alices = browser()
    alices.log_in(alice)
    copied = alices.session_cookie
    assert copied is not None
    thief = browser()
    thief.client.set_cookie("__Host-gateway_session", copied, domain="gateway.test")
    assert logged_in(thief)
    out = alices.post_form("/logout", {}, page="/logout")
    assert out.status_code == 303
    assert session_rows(app) == 0
    assert not logged_in(thief)


@pytest.mark.parametrize(("idle", "expected"), [(14, True), (16, False)])
def test_sessions_end_after_the_idle_timeout(
    browser: Callable[[], Browser], clock: FixedClock, alice: str, idle: int, expected: bool,
) -> None:
    alices = browser()
    alices.log_in(alice)
    clock.advance(minutes=idle)
    assert logged_in(alices) is expected


def test_sessions_end_after_their_lifetime_however_active(
    browser: Callable[[], Browser], clock: FixedClock, alice: str,
) -> None:
    alices = browser()
    alices.log_in(alice)
    for _ in range(8 * 6):  # a request every 10 minutes for 8 hours
        clock.advance(minutes=10)
        alices.get("/logout")
    assert not logged_in(alices)


def test_a_wrong_password_fails_and_is_audited_without_it(
    app: Flask, browser: Callable[[], Browser], alice: str,
) -> None:
    response = browser().log_in(alice, password="not-the-password-123")
    assert response.status_code == 401
    assert "not right" in response.get_data(as_text=True)
    with app.app_context():
        [event] = db.session().scalars(select(AuditEvent).where(
            AuditEvent.action == "login.failed")).all()
    assert event.target == "alice"
    assert "not-the-password" not in str(event.details)


def test_ten_failures_lock_the_account_even_for_the_right_password(
    browser: Callable[[], Browser], alice: str,
) -> None:
    attacker = browser()
    for _ in range(10):
        assert attacker.log_in(alice, password="guess-guess-guess").status_code == 401
    assert attacker.log_in(alice, password=PASSWORD).status_code == 429
    # From another address too: the account's budget is spent.
    other = browser()
    other.client.environ_base["REMOTE_ADDR"] = "198.51.100.7"
    assert other.log_in(alice, password=PASSWORD).status_code == 429


def test_ten_failures_from_one_address_lock_that_address(
    browser: Callable[[], Browser], make_user: Callable[..., str],
) -> None:
    attacker = browser()
    for number in range(10):
        attacker.log_in(f"nobody-{number}", password="guess-guess-guess")
    carol = make_user("carol")
    assert attacker.log_in(carol).status_code == 429
    elsewhere = browser()
    elsewhere.client.environ_base["REMOTE_ADDR"] = "198.51.100.8"
    assert elsewhere.log_in(carol).status_code == 303


def test_disabling_a_user_ends_their_sessions(
    app: Flask, browser: Callable[[], Browser], settings: Any, alice: str,
) -> None:
    alices = browser()
    alices.log_in(alice)
    with app.app_context(), db.transaction() as session:
        ended = identity.disable_user(session, SystemClock(), username="alice",
                                      public_url=settings.public_url, actor="test")
    assert ended == 1
    assert not logged_in(alices)
    assert browser().log_in(alice).status_code == 401


def test_a_hash_with_old_parameters_is_upgraded_at_login(
    app: Flask, browser: Callable[[], Browser], alice: str,
) -> None:
    from argon2 import PasswordHasher

    weaker = PasswordHasher(time_cost=1, memory_cost=8 * 1024, parallelism=1)
    with app.app_context(), db.transaction() as session:
        user = session.scalar(select(User).where(User.username == "alice"))
        assert user is not None
        user.password_hash = weaker.hash(PASSWORD)
    assert browser().log_in(alice).status_code == 303
    with app.app_context():
        stored = db.session().scalar(select(User.password_hash).where(User.username == "alice"))
    assert stored is not None
    assert not passwords.needs_rehash(stored)
    assert "m=19456,t=2,p=1" in stored


@pytest.mark.parametrize("target", [
    "//evil.example/", "/\\evil.example", "https:evil.example", "https://evil.example/",
    "//user@evil.example", "/\t/evil.example", "javascript:alert(1)", "evil.example",
])
def test_open_redirects_fall_back_to_a_safe_page(
    browser: Callable[[], Browser], alice: str, target: str,
) -> None:
    response = browser().log_in(alice, next_path=target)
    assert response.status_code == 303
    assert response.headers["Location"] == "/"


def test_a_cross_site_form_post_is_refused(browser: Callable[[], Browser], alice: str) -> None:
    visitor = browser()
    response = visitor.post_form("/login", {"username": alice, "password": PASSWORD},
                                 headers={"Sec-Fetch-Site": "cross-site"})
    assert response.status_code == 403
    assert not logged_in(visitor)


def test_a_post_without_csrf_token_is_refused(browser: Callable[[], Browser],
                                              alice: str) -> None:
    visitor = browser()
    visitor.get("/login")
    response = visitor.client.post("/login", data={"username": alice, "password": PASSWORD})
    assert response.status_code == 400
    assert not logged_in(visitor)
