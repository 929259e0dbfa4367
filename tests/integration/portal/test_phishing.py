"""The phishing defence, end to end with local accounts.

Alice has the MCP server make a link for Alice and sends it to Bob. Bob,
believing he is setting up his own account, would enter his key, and it
would land on Alice's account. The gateway must make that impossible.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Flask
from sqlalchemy import select

from gateway import db
from gateway.audit.models import AuditEvent
from gateway.credentials.models import Credential
from gateway.elicitations.models import Elicitation
from tests.conftest import Api
from tests.integration.portal.conftest import Browser, csrf_of


def state_of(app: Flask, elicitation_id: str) -> str:
    with app.app_context():
        found = db.session().get(Elicitation, elicitation_id)
        assert found is not None
        return found.status


def credentials(app: Flask) -> list[Credential]:
    with app.app_context():
        return list(db.session().scalars(select(Credential)))


def mismatches(app: Flask) -> list[AuditEvent]:
    with app.app_context():
        return list(db.session().scalars(select(AuditEvent).where(
            AuditEvent.action == "identity_mismatch")))


def test_bob_opening_alices_link_is_refused_and_changes_nothing(
    app: Flask, browser: Callable[[], Browser], alice: str, bob: str,
    link_for: Callable[..., dict[str, Any]],
) -> None:
    link = link_for(alice)
    bobs = browser()
    bobs.log_in(bob)
    page = bobs.get(f"/e/{link['id']}")
    assert page.status_code == 403
    text = page.get_data(as_text=True)
    assert "created for another account" in text
    assert "alice" not in text.lower()  # the intended account is not named
    assert 'name="secret"' not in text
    assert state_of(app, link["id"]) == "pending"
    [event] = mismatches(app)
    assert event.target == link["id"]
    assert event.outcome == "denied"
    assert "bob" in event.actor


def test_bobs_post_with_his_own_valid_csrf_token_is_refused(
    app: Flask, browser: Callable[[], Browser], alice: str, bob: str,
    link_for: Callable[..., dict[str, Any]],
) -> None:
    alices_link = link_for(alice)
    bobs_own_link = link_for(bob)
    bobs = browser()
    bobs.log_in(bob)
    # A token Bob's session really issued, from a page he may see.
    token = csrf_of(bobs.get(f"/e/{bobs_own_link['id']}"))
    for action in ("submit", "decline"):
        refused = bobs.client.post(f"/e/{alices_link['id']}", data={
            "csrf_token": token, "action": action, "secret": "bobs-real-key-123"})
        assert refused.status_code == 403
    assert state_of(app, alices_link["id"]) == "pending"
    assert credentials(app) == []
    assert len(mismatches(app)) == 2


def test_alice_still_completes_her_link_afterwards(
    app: Flask, browser: Callable[[], Browser], alice: str, bob: str,
    link_for: Callable[..., dict[str, Any]], api: Api,
) -> None:
    link = link_for(alice)
    bobs = browser()
    bobs.log_in(bob)
    assert bobs.get(f"/e/{link['id']}").status_code == 403

    alices = browser()
    login = alices.log_in(alice, next_path=f"/e/{link['id']}")
    assert login.status_code == 303
    assert login.headers["Location"] == f"/e/{link['id']}"
    page = alices.get(f"/e/{link['id']}")
    assert page.status_code == 200
    assert state_of(app, link["id"]) == "opened"
    done = alices.post_form(f"/e/{link['id']}", {"action": "submit",
                                                  "secret": "alices-weather-key-9f3a"})
    assert done.status_code == 200
    assert "This request is complete" in done.get_data(as_text=True)
    [stored] = credentials(app)
    assert (stored.subject_sub, stored.hint) == ("alice", "…9f3a")
    assert api.get(f"/api/v1/elicitations/{link['id']}").get_json()["status"] == "completed"


def test_without_a_session_the_link_leads_to_login_and_back(
    browser: Callable[[], Browser], alice: str, link_for: Callable[..., dict[str, Any]],
) -> None:
    link = link_for(alice)
    anonymous = browser()
    first = anonymous.get(f"/e/{link['id']}")
    assert first.status_code == 302
    assert first.headers["Location"] == f"/login?next=%2Fe%2F{link['id']}"
    posted = anonymous.client.post(f"/e/{link['id']}", data={"action": "decline"})
    assert posted.status_code in (302, 400)  # no session: to login, or no CSRF token


def test_an_unknown_link_says_so_without_a_login(browser: Callable[[], Browser],
                                                 alice: str) -> None:
    alices = browser()
    alices.log_in(alice)
    page = alices.get("/e/el_nosuchlinkatallhere000000")
    assert page.status_code == 404
    assert "not valid" in page.get_data(as_text=True)
