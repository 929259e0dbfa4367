"""Reading, listing and cancelling; exact expiry; one client never sees another's."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select

from gateway import db
from gateway.audit.models import AuditEvent
from gateway.clock import FixedClock
from tests.conftest import Api, Registered
from tests.integration.api.test_create import SUBJECT, assert_problem, body


@pytest.fixture
def created(api: Api) -> dict[str, Any]:
    response = api.post("/api/v1/elicitations", body(ttl_seconds=120))
    assert response.status_code == 201
    result: dict[str, Any] = response.get_json()
    return result


def test_read_returns_what_create_returned(api: Api, created: dict[str, Any]) -> None:
    response = api.get(f"/api/v1/elicitations/{created['id']}")
    assert response.status_code == 200
    assert response.get_json() == created


def test_another_clients_elicitation_is_exactly_like_an_unknown_one(
    client: FlaskClient, register: Callable[..., Registered], created: dict[str, Any],
) -> None:
    intruder = Api(client, register().api_token)
    theirs = intruder.get(f"/api/v1/elicitations/{created['id']}")
    unknown = intruder.get("/api/v1/elicitations/el_doesnotexistatall000000")
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.get_json()["detail"].replace(created["id"], "X") == \
        unknown.get_json()["detail"].replace("el_doesnotexistatall000000", "X")
    cancel = intruder.post(f"/api/v1/elicitations/{created['id']}/cancel")
    assert cancel.status_code == 404
    assert intruder.get("/api/v1/elicitations").get_json()["items"] == []


def test_expiry_is_exact_even_before_the_sweeper(
    api: Api, app: Flask, clock: FixedClock, created: dict[str, Any],
) -> None:
    clock.advance(seconds=119)
    assert api.get(f"/api/v1/elicitations/{created['id']}").get_json()["status"] == "pending"
    clock.advance(seconds=1)
    read = api.get(f"/api/v1/elicitations/{created['id']}").get_json()
    assert read["status"] == "expired"
    assert read["ended_at"] is not None
    with app.app_context():
        actions = db.session().scalars(
            select(AuditEvent.action).where(AuditEvent.target == created["id"])).all()
    assert actions == ["elicitation.created", "elicitation.expired"]


def test_an_expired_elicitation_cannot_be_cancelled(
    api: Api, clock: FixedClock, created: dict[str, Any],
) -> None:
    clock.advance(seconds=121)
    response = api.post(f"/api/v1/elicitations/{created['id']}/cancel")
    problem = assert_problem(response, 409)
    assert problem["elicitation_status"] == "expired"


def test_cancel_ends_it_once(api: Api, app: Flask, created: dict[str, Any]) -> None:
    first = api.post(f"/api/v1/elicitations/{created['id']}/cancel")
    assert first.status_code == 200
    assert first.get_json()["status"] == "cancelled"
    again = api.post(f"/api/v1/elicitations/{created['id']}/cancel")
    problem = assert_problem(again, 409, "cancelled")
    assert problem["elicitation_status"] == "cancelled"
    with app.app_context():
        actions = db.session().scalars(
            select(AuditEvent.action).where(AuditEvent.target == created["id"])).all()
    assert actions.count("elicitation.cancelled") == 1


def test_list_filters_and_pages_with_a_cursor(api: Api, clock: FixedClock) -> None:
    made = []
    for number in range(5):
        clock.advance(seconds=1)
        made.append(api.post("/api/v1/elicitations", body(
            subject={**SUBJECT, "sub": f"user-{number}"})).get_json()["id"])
    api.post(f"/api/v1/elicitations/{made[0]}/cancel")
    seen: list[str] = []
    cursor = None
    while True:
        query = "?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = api.get(f"/api/v1/elicitations{query}").get_json()
        assert len(page["items"]) <= 2
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(made))  # newest first, each once
    pending = api.get("/api/v1/elicitations?status=pending").get_json()["items"]
    assert {item["id"] for item in pending} == set(made[1:])
    one = api.get("/api/v1/elicitations?subject_sub=user-3&subject_iss="
                  + SUBJECT["iss"]).get_json()["items"]
    assert [item["id"] for item in one] == [made[3]]
    assert api.get("/api/v1/elicitations?kind=payment").get_json()["items"] == []


@pytest.mark.parametrize(("query", "field"), [
    ("status=finished", "status"), ("kind=letter", "kind"), ("limit=0", "limit"),
    ("limit=101", "limit"), ("cursor=not-a-cursor", "cursor"),
])
def test_bad_list_parameters_are_named(api: Api, query: str, field: str) -> None:
    problem = assert_problem(api.get(f"/api/v1/elicitations?{query}"), 422)
    assert problem["field"] == field


def crafted(raw: str) -> str:
    """A cursor as the API encodes one, around a position it never returned."""
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@pytest.mark.parametrize("listing", ["elicitations", "credentials"])
@pytest.mark.parametrize("raw", [
    "0001-01-01T00:00:00+14:00|el_x",  # before year 1 once in UTC
    "2026-01-01T00:00:00+00:00|el_\x00",  # PostgreSQL refuses a NUL
    "2026-01-01T00:00:00|el_x",  # no time zone
], ids=["out-of-range", "nul", "naive"])
def test_a_crafted_cursor_is_refused_by_every_listing(api: Api, listing: str, raw: str) -> None:
    problem = assert_problem(api.get(f"/api/v1/{listing}?cursor={crafted(raw)}"), 422)
    assert problem["field"] == "cursor"


@pytest.mark.parametrize("listing", ["elicitations", "credentials"])
def test_an_empty_cursor_asks_for_the_first_page(
    api: Api, created: dict[str, Any], listing: str,
) -> None:
    first = api.get(f"/api/v1/{listing}")
    assert first.status_code == 200
    assert api.get(f"/api/v1/{listing}?cursor=").get_json() == first.get_json()


@pytest.mark.parametrize("wait", ["61", "-1", "soon", "1.5"])
def test_wait_is_bounded(api: Api, created: dict[str, Any], wait: str) -> None:
    problem = assert_problem(api.get(f"/api/v1/elicitations/{created['id']}?wait={wait}"), 422)
    assert problem["field"] == "wait"
