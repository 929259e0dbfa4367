"""Capturing a key on the page, and the owning client's retrieval API."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gateway import db
from gateway.audit.models import AuditEvent
from gateway.clients import service as clients
from gateway.clients.models import Client
from gateway.clock import FixedClock, SystemClock
from gateway.credentials import service as credentials
from gateway.credentials.catalog import CredentialType, current_catalog
from gateway.credentials.models import Credential
from gateway.elicitations import lifecycle, views
from gateway.elicitations.models import Elicitation
from gateway.identity.sessions import Subject
from gateway.vault import keyring
from gateway.vault.keyring import current_keyring
from tests.conftest import Api, Registered, client_for
from tests.integration.api.test_unit_of_work import READ, WRITE, only_sqlite_tells, transactions_of
from tests.integration.portal.conftest import Browser, csrf_of

KEY = "wx-live-7f3a9c2e5b1d4a6f8e0c"


@pytest.fixture
def alices(browser: Callable[[], Browser], alice: str) -> Browser:
    logged_in = browser()
    logged_in.log_in(alice)
    return logged_in


def submit(browser: Browser, link: dict[str, Any], secret: str = KEY) -> Any:
    return browser.post_form(f"/e/{link['id']}", {"action": "submit", "secret": secret})


def everything_stored(app: Flask) -> str:
    with app.app_context():
        session = db.session()
        return "\n".join(repr(row) for table in db.Base.metadata.sorted_tables
                         for row in session.execute(select(table)))


def test_the_page_shows_who_asks_what_and_until_when(
    alices: Browser, link_for: Callable[..., dict[str, Any]],
) -> None:
    link = link_for("alice", message="Connect your weather API key for forecasts")
    page = alices.get(f"/e/{link['id']}").get_data(as_text=True)
    assert "mcp-server-1" in page  # the client's registered name
    assert "gateway.test" in page
    assert "Connect your weather API key for forecasts" in page
    assert "Link expires" in page
    assert "UTC" in page
    assert 'type="password"' in page
    assert 'autocomplete="off"' in page
    assert "Decline" in page


def test_a_captured_key_is_revealed_exactly_to_its_client(
    app: Flask, api: Api, alices: Browser, link_for: Callable[..., dict[str, Any]],
) -> None:
    link = link_for("alice")
    done = submit(alices, link)
    assert done.status_code == 200
    text = done.get_data(as_text=True)
    assert "You can go back to mcp-server-1" in text
    assert KEY not in text
    listed = api.get("/api/v1/credentials?subject_sub=alice&type=generic").get_json()["items"]
    [credential] = listed
    assert credential["hint"] == "…8e0c"
    assert credential["elicitation_id"] == link["id"]
    assert "secret" not in credential
    revealed = api.post(f"/api/v1/credentials/{credential['id']}/reveal")
    assert revealed.status_code == 200
    assert revealed.headers["Cache-Control"] == "no-store"
    assert revealed.get_json() == {"id": credential["id"], "type": "generic", "secret": KEY}
    assert KEY not in everything_stored(app)
    with app.app_context():
        actions = db.session().scalars(select(AuditEvent.action)).all()
    assert {"credential.captured", "credential.revealed", "elicitation.completed"} <= set(actions)


def test_another_client_cannot_see_reveal_or_revoke_it(
    client: FlaskClient, register: Callable[..., Registered], alices: Browser,
    link_for: Callable[..., dict[str, Any]], api: Api,
) -> None:
    submit(alices, link_for("alice"))
    [credential] = api.get("/api/v1/credentials").get_json()["items"]
    other = Api(client, register().api_token)
    assert other.get("/api/v1/credentials").get_json()["items"] == []
    assert other.post(f"/api/v1/credentials/{credential['id']}/reveal").status_code == 404
    assert other.client.delete(f"/api/v1/credentials/{credential['id']}",
                               headers=other.headers()).status_code == 404


def test_a_revoked_key_is_never_revealed_again(
    api: Api, alices: Browser, link_for: Callable[..., dict[str, Any]],
) -> None:
    submit(alices, link_for("alice"))
    [credential] = api.get("/api/v1/credentials").get_json()["items"]
    revoked = api.client.delete(f"/api/v1/credentials/{credential['id']}",
                                headers=api.headers())
    assert revoked.get_json()["status"] == "revoked"
    assert api.post(f"/api/v1/credentials/{credential['id']}/reveal").status_code == 409
    assert api.get("/api/v1/credentials").get_json()["items"] == []
    assert len(api.get("/api/v1/credentials?status=all").get_json()["items"]) == 1


def test_a_new_key_supersedes_the_old_one(
    app: Flask, api: Api, alices: Browser, link_for: Callable[..., dict[str, Any]],
    clock: FixedClock,
) -> None:
    submit(alices, link_for("alice"))
    clock.advance(seconds=1)
    submit(alices, link_for("alice"), secret="wx-live-second-key-000000")
    new, old = api.get("/api/v1/credentials?status=all").get_json()["items"]
    assert [new["status"], old["status"]] == ["active", "revoked"]
    revealed = api.post(f"/api/v1/credentials/{new['id']}/reveal").get_json()
    assert revealed["secret"] == "wx-live-second-key-000000"
    with app.app_context():
        [revocation] = db.session().scalars(select(AuditEvent).where(
            AuditEvent.action == "credential.revoked")).all()
    assert revocation.target == old["id"]
    assert revocation.details["reason"] == "superseded"
    assert revocation.details["superseded_by"] == new["id"]


def _read_and_seal(app: Flask, clock: FixedClock, link: dict[str, Any],
                   secret: str = KEY) -> tuple[Elicitation, Credential]:
    """The link's elicitation as the page reads it, and the key sealed for it."""
    with app.app_context():
        read = db.session().get(Elicitation, link["id"])
        assert read is not None
        return read, credentials.seal_for(current_keyring(), read, _generic(), secret,
                                          clock.now())


def _store(app: Flask, clock: FixedClock, read: Elicitation, credential: Credential) -> bool:
    """Store the key as the page does, from what it read; whether it was stored."""

    def attempt() -> None:
        with db.transaction() as session:
            credentials.capture(session, clock, session.merge(read, load=False), credential,
                                actor="user:alice", source_ip=None)

    with app.app_context():
        try:
            db.retry_on_conflict(attempt, attempts=credentials.OWNER_RACES,
                                 conflict=credentials.CaptureRaced)
        except lifecycle.IllegalTransition:
            return False
    return True


def _capture(app: Flask, clock: FixedClock, link: dict[str, Any], secret: str) -> bool:
    return _store(app, clock, *_read_and_seal(app, clock, link, secret))


def _generic() -> CredentialType:
    generic = current_catalog().get("generic")
    assert generic is not None
    return generic


def test_keys_captured_at_the_same_moment_leave_one_live(
    app: Flask, alices: Browser, link_for: Callable[..., dict[str, Any]], clock: FixedClock,
) -> None:
    links = [link_for("alice") for _ in range(4)]
    for link in links:
        alices.get(f"/e/{link['id']}")  # opened, as the user's tabs are
    # Another key for the same owner, written but not committed while the
    # captures start: each must end up seeing it, and the others' keys.
    written, may_commit = threading.Event(), threading.Event()

    def store_a_key_in_a_transaction_left_open() -> str:
        _, credential = _read_and_seal(app, clock, links[0], "key-held-open-000000000")
        with app.app_context(), db.engine().begin() as connection, \
                Session(bind=connection) as session:
            session.add(credential)
            session.flush()
            written.set()
            may_commit.wait(10)
        return credential.id

    with ThreadPoolExecutor(max_workers=len(links)) as pool:
        held = pool.submit(store_a_key_in_a_transaction_left_open)
        assert written.wait(10)
        captures = [pool.submit(_capture, app, clock, link, f"key-number-{n}-000000000")
                    for n, link in enumerate(links[1:])]
        time.sleep(0.3)
        may_commit.set()
        held_id = held.result(10)
        assert all(capture.result(10) for capture in captures)
    with app.app_context():
        stored = db.session().scalars(select(Credential)).all()
    assert len(stored) == len(links)
    assert len([c for c in stored if c.revoked_at is None]) == 1
    assert next(c for c in stored if c.id == held_id).revoked_at is not None


def test_two_captures_of_one_link_at_the_same_moment_store_one_and_fail_neither(
    app: Flask, api: Api, alices: Browser, link_for: Callable[..., dict[str, Any]],
    clock: FixedClock, settings: Any,
) -> None:
    link = link_for("alice")
    alices.get(f"/e/{link['id']}")
    # The first tab's capture is written but not committed when the second
    # tab's starts: the second must end on the completed link, not on an error.
    written, may_commit = threading.Event(), threading.Event()

    def capture_left_open() -> None:
        read, credential = _read_and_seal(app, clock, link, "first-tab-key-000000000")
        with app.app_context(), db.transaction() as session:
            credentials.capture(session, clock, session.merge(read, load=False), credential,
                                actor="user:alice", source_ip=None)
            session.flush()
            written.set()
            may_commit.wait(10)

    def second_tab() -> str:
        _, credential = _read_and_seal(app, clock, link, "second-tab-key-00000000")
        with app.test_request_context():
            alice = Subject(settings.public_url, "alice")
            return views.store(link["id"], alice, credential).status

    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(capture_left_open)
        assert written.wait(10)
        second = pool.submit(second_tab)
        time.sleep(0.5)  # the second tab's store has begun, and waits on the first
        may_commit.set()
        first.result(10)
        assert second.result(10) == "completed"
    [stored] = api.get("/api/v1/credentials").get_json()["items"]
    assert api.post(f"/api/v1/credentials/{stored['id']}/reveal").get_json()["secret"] == \
        "first-tab-key-000000000"


def test_the_database_refuses_a_second_live_key_for_an_owner(
    app: Flask, alices: Browser, link_for: Callable[..., dict[str, Any]], clock: FixedClock,
) -> None:
    first, second = (_read_and_seal(app, clock, link_for("alice"), f"key-{n}-000000000000")[1]
                     for n in (1, 2))
    with app.app_context():
        session = db.session()
        session.add(first)
        session.commit()
        session.add(second)
        with pytest.raises(IntegrityError, match=r"ix_credentials_live_owner|UNIQUE"):
            session.commit()


def test_a_capture_for_an_elicitation_that_ended_meanwhile_writes_nothing(
    app: Flask, api: Api, alices: Browser, link_for: Callable[..., dict[str, Any]],
    clock: FixedClock,
) -> None:
    link = link_for("alice")
    read, credential = _read_and_seal(app, clock, link)
    before = everything_stored(app)
    assert api.post(f"/api/v1/elicitations/{link['id']}/cancel").status_code == 200
    cancelled = everything_stored(app)
    assert _store(app, clock, read, credential) is False
    assert everything_stored(app) == cancelled != before
    assert api.get(f"/api/v1/elicitations/{link['id']}").get_json()["status"] == "cancelled"


def test_a_capture_after_the_link_expired_writes_nothing(
    app: Flask, alices: Browser, link_for: Callable[..., dict[str, Any]], clock: FixedClock,
) -> None:
    link = link_for("alice", ttl_seconds=60)
    token = csrf_of(alices.get(f"/e/{link['id']}"))
    read, credential = _read_and_seal(app, clock, link)
    before = everything_stored(app)
    clock.advance(seconds=60)  # as if a slow live check ran past the link's end
    assert _store(app, clock, read, credential) is False
    assert everything_stored(app) == before
    expired = alices.client.post(f"/e/{link['id']}", data={
        "csrf_token": token, "action": "submit", "secret": KEY})
    assert "This link has expired" in expired.get_data(as_text=True)
    assert everything_stored(app) != before  # marked expired, and nothing else
    with app.app_context():
        assert db.session().scalars(select(Credential)).all() == []


def test_a_key_submitted_from_a_page_read_before_another_tab_opened_it_is_stored(
    app: Flask, api: Api, alices: Browser, link_for: Callable[..., dict[str, Any]],
    clock: FixedClock,
) -> None:
    link = link_for("alice")
    read, credential = _read_and_seal(app, clock, link)
    assert read.status == "pending"
    alices.get(f"/e/{link['id']}")  # another tab opens it
    assert _store(app, clock, read, credential) is False
    # The page reads it again and stores the key then, as submitting does.
    assert "This request is complete" in submit(alices, link).get_data(as_text=True)
    assert api.get(f"/api/v1/elicitations/{link['id']}").get_json()["status"] == "completed"


def test_a_link_ended_while_its_key_was_checked_shows_its_end_and_stores_nothing(
    app: Flask, alices: Browser, link_for: Callable[..., dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    link = link_for("alice")
    alices.get(f"/e/{link['id']}")
    checked = views._verified

    def declined_in_another_tab(*arguments: Any) -> Any:
        # While the key is checked, the user declines in another tab.
        with db.engine().begin() as connection:
            connection.execute(update(Elicitation).where(Elicitation.id == link["id"])
                               .values(status="declined"))
        return checked(*arguments)

    monkeypatch.setattr(views, "_verified", declined_in_another_tab)
    answer = submit(alices, link)
    assert answer.status_code == 200
    assert "You declined this request" in answer.get_data(as_text=True)
    with app.app_context():
        assert db.session().scalars(select(Credential)).all() == []


def test_a_second_submit_changes_nothing(
    app: Flask, alices: Browser, link_for: Callable[..., dict[str, Any]],
) -> None:
    link = link_for("alice")
    # Both posts come from the same page, as from a second click or a stale tab.
    token = csrf_of(alices.get(f"/e/{link['id']}"))
    for secret in (KEY, "a-different-key-entirely"):
        again = alices.client.post(f"/e/{link['id']}", data={
            "csrf_token": token, "action": "submit", "secret": secret})
    assert again.status_code == 200
    assert "This request is complete" in again.get_data(as_text=True)
    with app.app_context():
        assert len(db.session().scalars(select(Credential)).all()) == 1


def test_decline_stores_nothing(
    app: Flask, api: Api, alices: Browser, link_for: Callable[..., dict[str, Any]],
) -> None:
    link = link_for("alice")
    declined = alices.post_form(f"/e/{link['id']}", {"action": "decline"})
    assert "You declined" in declined.get_data(as_text=True)
    assert api.get(f"/api/v1/elicitations/{link['id']}").get_json()["status"] == "declined"
    assert api.get("/api/v1/credentials?status=all").get_json()["items"] == []


@pytest.mark.parametrize(("secret", "words"), [
    ("", "Enter your"),
    ("k" * 4097, "at most 4096"),
    ("first-line\nsecond-line", "no line breaks"),
    ("with\ttab-inside-it", "no line breaks"),
    ("bell\x07character", "control"),
], ids=["empty", "too-long", "newline", "tab", "control"])
def test_bad_keys_are_refused_without_echo_and_can_be_retried(
    app: Flask, alices: Browser, link_for: Callable[..., dict[str, Any]], secret: str,
    words: str,
) -> None:
    link = link_for("alice")
    refused = submit(alices, link, secret=secret)
    assert refused.status_code == 422
    text = refused.get_data(as_text=True)
    assert words in text
    if secret:
        assert secret not in text
    with app.app_context():
        assert db.session().get(Elicitation, link["id"]).status == "opened"  # type: ignore[union-attr]
        assert db.session().scalars(select(Credential)).all() == []
    assert submit(alices, link).status_code == 200


def test_account_lists_and_revokes_the_users_own_keys(
    api: Api, alices: Browser, browser: Callable[[], Browser], bob: str,
    link_for: Callable[..., dict[str, Any]],
) -> None:
    submit(alices, link_for("alice"))
    page = alices.get("/account").get_data(as_text=True)
    assert "mcp-server-1" in page
    assert "…8e0c" in page
    assert KEY not in page
    [credential] = api.get("/api/v1/credentials").get_json()["items"]
    bobs = browser()
    bobs.log_in(bob)
    assert "no stored keys" in bobs.get("/account").get_data(as_text=True)
    # A valid token of Bob's own session, from a page of his.
    stolen = bobs.post_form(f"/account/credentials/{credential['id']}/revoke", {},
                            page="/logout")
    assert stolen.status_code == 404
    revoked = alices.post_form(f"/account/credentials/{credential['id']}/revoke", {},
                               page="/account")
    assert revoked.status_code == 303
    assert "no stored keys" in alices.get("/account").get_data(as_text=True)
    assert api.post(f"/api/v1/credentials/{credential['id']}/reveal").status_code == 409


def test_a_key_sealed_under_another_keyring_is_refused_plainly(
    app: Flask, api: Api, alices: Browser, link_for: Callable[..., dict[str, Any]],
) -> None:
    submit(alices, link_for("alice"))
    [credential] = api.get("/api/v1/credentials").get_json()["items"]
    # As after a restore beside the wrong keyring.
    app.extensions[keyring.EXTENSION] = keyring.Keyring({1: os.urandom(32)})
    refused = api.post(f"/api/v1/credentials/{credential['id']}/reveal")
    assert refused.status_code == 500
    assert refused.mimetype == "application/problem+json"
    problem = refused.get_json()
    assert problem["type"].endswith("credential-unreadable")
    assert "keyring" in problem["detail"]
    assert KEY not in refused.get_data(as_text=True)


def test_a_reveal_needs_a_live_token_of_an_active_client(
    app: Flask, client: FlaskClient, api: Api, alices: Browser,
    link_for: Callable[..., dict[str, Any]],
) -> None:
    # The reveal reads the sealed key in the statement that checks the token:
    # no token, a wrong one or a disabled client gets 401 and no key.
    submit(alices, link_for("alice"))
    [credential] = api.get("/api/v1/credentials").get_json()["items"]
    path = f"/api/v1/credentials/{credential['id']}/reveal"
    for refused in (client.post(path), Api(client, "gw_" + "B" * 43).post(path)):
        assert refused.status_code == 401
        assert KEY not in refused.get_data(as_text=True)
    with app.app_context(), db.transaction() as session:
        [owner] = session.scalars(select(Client.id)).all()
        clients.disable_client(session, SystemClock(), client_ref=owner, actor="test")
    refused = api.post(path)
    assert refused.status_code == 401
    assert "disabled" in refused.get_json()["detail"]
    assert KEY not in refused.get_data(as_text=True)


def test_concurrent_reveals_each_commit_their_own_audit_event(
    app: Flask, api: Api, alices: Browser, link_for: Callable[..., dict[str, Any]],
) -> None:
    # Each reveal answers only once its own audit event is stored.
    submit(alices, link_for("alice"))
    [credential] = api.get("/api/v1/credentials").get_json()["items"]
    path = f"/api/v1/credentials/{credential['id']}/reveal"

    def reveal(_: int) -> tuple[int, Any]:
        response = Api(client_for(app), api.token).post(path)
        return response.status_code, response.get_json()

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(reveal, range(40)))
    assert answers == [(200, {"id": credential["id"], "type": "generic", "secret": KEY})] * 40
    with app.app_context():
        revealed = db.session().scalars(select(AuditEvent.target).where(
            AuditEvent.action == "credential.revealed")).all()
    assert revealed == [credential["id"]] * 40


def test_a_reveal_is_one_transaction_that_writes_from_its_token_check(
    app: Flask, api: Api, alices: Browser, link_for: Callable[..., dict[str, Any]],
) -> None:
    submit(alices, link_for("alice"))
    [credential] = api.get("/api/v1/credentials").get_json()["items"]
    with transactions_of(app) as begun:
        revealed = api.post(f"/api/v1/credentials/{credential['id']}/reveal")
    assert revealed.get_json()["secret"] == KEY
    assert only_sqlite_tells(begun, app) == only_sqlite_tells([WRITE], app)


def test_a_key_submit_is_one_write_transaction(
    app: Flask, alices: Browser, link_for: Callable[..., dict[str, Any]],
) -> None:
    # The browser session and the link are read first; the key is checked
    # holding no transaction; the opening, the capture and the completion
    # are one write. (The process's first seal reads and announces its key
    # version, once in a while: the first submit does that here.)
    submit(alices, link_for("alice"))
    link = link_for("alice")
    token = csrf_of(alices.get(f"/e/{link['id']}"))
    with transactions_of(app) as begun:
        answer = alices.client.post(f"/e/{link['id']}", data={
            "csrf_token": token, "action": "submit", "secret": KEY})
    assert "This request is complete" in answer.get_data(as_text=True)
    assert only_sqlite_tells(begun, app) == only_sqlite_tells([READ, WRITE], app)
