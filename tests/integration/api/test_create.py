"""POST /api/v1/elicitations: what a client gets back, retries, reuse, and every bad input."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import func, select

from gateway import db
from gateway.audit.models import AuditEvent
from gateway.elicitations.models import Elicitation
from tests.conftest import Api, Registered

SUBJECT = {"iss": "https://auth.example.com", "sub": "user-42"}


def body(**changes: Any) -> dict[str, Any]:
    """A valid API-key create request, with changes."""
    return {"subject": SUBJECT, "kind": "api_key", "credential_type": "generic",
            "message": "Connect your weather API key", **changes}


def count(app: Flask, model: type[Any]) -> int:
    with app.app_context():
        return db.session().scalar(select(func.count()).select_from(model)) or 0


def assert_problem(response: Any, status: int, *words: str) -> dict[str, Any]:
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.mimetype == "application/problem+json"
    problem: dict[str, Any] = response.get_json()
    assert problem["status"] == status
    for word in words:
        assert word in problem["detail"], problem
    return problem


def test_create_returns_the_link_and_the_mcp_params(api: Api, app: Flask) -> None:
    response = api.post("/api/v1/elicitations", body(metadata={"tool": "forecast"}))
    assert response.status_code == 201
    created = response.get_json()
    assert created["status"] == "pending"
    assert created["url"] == f"https://gateway.test/e/{created['id']}"
    assert response.headers["Location"] == f"/api/v1/elicitations/{created['id']}"
    assert response.headers["Cache-Control"] == "no-store"
    assert created["mcp"] == {"mode": "url", "message": "Connect your weather API key",
                              "url": created["url"], "elicitationId": created["id"]}
    assert created["metadata"] == {"tool": "forecast"}
    assert created["subject"] == SUBJECT
    # The link holds the id only: nothing about the user, nothing that logs in.
    assert "user-42" not in created["url"]
    assert "auth.example" not in created["url"]
    assert len(created["id"]) >= 22  # 128+ random bits, URL-safe
    with app.app_context():
        actions = db.session().scalars(select(AuditEvent.action)).all()
    assert "elicitation.created" in actions


def test_default_ttl_is_fifteen_minutes_and_bounds_hold(api: Api) -> None:
    from datetime import datetime

    created = api.post("/api/v1/elicitations", body()).get_json()
    lifetime = (datetime.fromisoformat(created["expires_at"])
                - datetime.fromisoformat(created["created_at"]))
    assert lifetime.total_seconds() == 900
    for ttl in (59, 86401):
        problem = assert_problem(api.post("/api/v1/elicitations",
                                          body(ttl_seconds=ttl, reuse_pending=False)), 422)
        assert problem["errors"][0]["field"] == "ttl_seconds"


def test_same_idempotency_key_and_body_give_the_same_answer(api: Api, app: Flask) -> None:
    headers = {"Idempotency-Key": "retry-1"}
    first = api.post("/api/v1/elicitations", body(reuse_pending=False), headers=headers)
    second = api.post("/api/v1/elicitations", body(reuse_pending=False), headers=headers)
    assert first.status_code == second.status_code == 201
    assert first.get_json() == second.get_json()
    assert count(app, Elicitation) == 1


def test_same_idempotency_key_with_another_body_is_a_conflict(api: Api, app: Flask) -> None:
    headers = {"Idempotency-Key": "retry-2"}
    api.post("/api/v1/elicitations", body(), headers=headers)
    response = api.post("/api/v1/elicitations", body(message="Another"), headers=headers)
    assert_problem(response, 409, "Idempotency-Key")
    assert count(app, Elicitation) == 1


def test_idempotency_keys_belong_to_one_client(
    client: FlaskClient, register: Callable[..., Registered], app: Flask,
) -> None:
    alice, bob = (Api(client, register().api_token) for _ in range(2))
    headers = {"Idempotency-Key": "shared"}
    first = alice.post("/api/v1/elicitations", body(), headers=headers).get_json()
    second = bob.post("/api/v1/elicitations", body(), headers=headers).get_json()
    assert first["id"] != second["id"]


def test_a_still_pending_elicitation_is_reused(api: Api, app: Flask) -> None:
    first = api.post("/api/v1/elicitations", body())
    again = api.post("/api/v1/elicitations", body(message="Retrying"))
    assert first.status_code == 201
    assert again.status_code == 200
    assert again.get_json()["id"] == first.get_json()["id"]
    assert count(app, Elicitation) == 1


@pytest.mark.parametrize("change", [
    {"subject": {"iss": SUBJECT["iss"], "sub": "someone-else"}},
    {"subject": {"iss": "https://other-issuer.example", "sub": SUBJECT["sub"]}},
    {"reuse_pending": False},
])
def test_reuse_needs_the_same_subject_and_can_be_refused(api: Api, change: dict[str, Any]) -> None:
    first = api.post("/api/v1/elicitations", body()).get_json()
    other = api.post("/api/v1/elicitations", body(**change))
    assert other.status_code == 201
    assert other.get_json()["id"] != first["id"]


def test_an_ended_elicitation_is_not_reused(api: Api) -> None:
    first = api.post("/api/v1/elicitations", body()).get_json()
    api.post(f"/api/v1/elicitations/{first['id']}/cancel")
    again = api.post("/api/v1/elicitations", body())
    assert again.status_code == 201
    assert again.get_json()["id"] != first["id"]


def test_payments_are_refused_while_stripe_is_not_configured(api: Api, app: Flask) -> None:
    response = api.post("/api/v1/elicitations", {
        "subject": SUBJECT, "kind": "payment", "message": "Pay for the report",
        "payment": {"amount": 1999, "currency": "usd", "description": "Report"}})
    problem = assert_problem(response, 422, "GATEWAY_STRIPE_SECRET_KEY")
    assert problem["type"].endswith("payments-not-configured")
    assert count(app, Elicitation) == 0


# --- bad input: a problem naming what is wrong, and nothing written ------------------


@pytest.mark.parametrize(("payload", "status", "field"), [
    (body(subject={"iss": "https://auth.example.com"}), 422, "subject.sub"),
    (body(subject={"sub": "user-42"}), 422, "subject.iss"),
    (body(surprise=True), 422, "surprise"),
    (body(ttl_seconds="900"), 422, "ttl_seconds"),
    (body(message=""), 422, "message"),
    (body(kind="telepathy"), 422, "kind"),
    (body(metadata={"blob": "x" * 9000}), 422, "metadata"),
    (body(credential_type=None), 422, "credential_type"),
    ({**body(), "kind": "payment"}, 422, "credential_type"),
], ids=["no-sub", "no-iss", "unknown-field", "string-for-int", "empty-message",
        "unknown-kind", "metadata-over-8k", "null-type", "payment-without-payment"])
def test_invalid_bodies_name_the_field(api: Api, app: Flask, payload: dict[str, Any],
                                       status: int, field: str) -> None:
    problem = assert_problem(api.post("/api/v1/elicitations", payload), status)
    assert field in problem["detail"]
    assert count(app, Elicitation) == 0


def test_not_json_is_refused(api: Api, app: Flask) -> None:
    broken = api.post("/api/v1/elicitations", data="{not json",
                      headers={"Content-Type": "application/json"})
    assert_problem(broken, 400, "not valid JSON")
    form = api.post("/api/v1/elicitations", data="a=b",
                    headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert_problem(form, 415, "JSON")
    assert count(app, Elicitation) == 0


def test_a_body_over_64_kib_is_refused(api: Api, app: Flask) -> None:
    huge = json.dumps(body(message="x" * (65 * 1024)))
    response = api.post("/api/v1/elicitations", data=huge,
                        headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert response.mimetype == "application/problem+json"
    assert count(app, Elicitation) == 0


@pytest.mark.parametrize("size", [64 * 1024, 65 * 1024])
def test_a_chunked_body_meets_the_same_limit(api: Api, app: Flask, size: int) -> None:
    # Valid JSON at any length, so that a body cut at 64 KiB would still parse.
    padded = json.dumps(body()).encode().ljust(size, b" ")
    chunked = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    # gunicorn ends a chunked body's stream itself, and says so.
    response = api.post("/api/v1/elicitations", data=padded, headers=chunked,
                        environ_overrides={"wsgi.input_terminated": True})
    if size > 64 * 1024:
        assert_problem(response, 413)
        assert count(app, Elicitation) == 0
    else:
        assert response.status_code == 201, response.get_data(as_text=True)


def test_unknown_credential_type_is_refused(api: Api, app: Flask) -> None:
    problem = assert_problem(api.post("/api/v1/elicitations", body(credential_type="nope")),
                             422, "nope", "generic")
    assert problem["field"] == "credential_type"
    assert count(app, Elicitation) == 0


def test_a_client_limited_to_other_types_is_refused(
    client: FlaskClient, register: Callable[..., Registered], app: Flask,
) -> None:
    # The catalog holds only `generic`; restrict a client to it, then widen the
    # catalog view by asking with a type this client lacks.
    restricted = register(credential_types=["generic"])
    with app.app_context(), db.transaction() as session:
        from gateway.clients.models import Client

        session.get(Client, restricted.id).credential_types = ["openai"]  # type: ignore[union-attr]
    response = Api(client, restricted.api_token).post("/api/v1/elicitations", body())
    assert_problem(response, 422, "may not ask", "openai")
    assert count(app, Elicitation) == 0


def test_a_bad_idempotency_key_is_refused(api: Api, app: Flask) -> None:
    response = api.post("/api/v1/elicitations", body(),
                        headers={"Idempotency-Key": "has spaces in it"})
    assert_problem(response, 422, "Idempotency-Key")
    assert count(app, Elicitation) == 0
