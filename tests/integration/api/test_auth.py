"""Who may call the API: live tokens of active clients, in the header only."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import func, select

from gateway import db
from gateway.clients import service as clients
from gateway.clients.models import ApiToken, Client
from gateway.clock import SystemClock
from gateway.elicitations.models import Elicitation
from gateway.settings import Settings
from tests.conftest import Api, Registered
from tests.integration.api.test_create import assert_problem, body


@pytest.fixture
def registered(register: Callable[..., Registered]) -> Registered:
    return register()


def elicitation_count(app: Flask) -> int:
    with app.app_context():
        return db.session().scalar(select(func.count()).select_from(Elicitation)) or 0


def test_no_token_gets_401_with_a_bearer_challenge(client: FlaskClient, app: Flask) -> None:
    response = client.post("/api/v1/elicitations", json=body())
    assert_problem(response, 401, "Authorization: Bearer")
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="gateway"'
    assert elicitation_count(app) == 0


@pytest.mark.parametrize("header", [
    "Bearer gw_" + "A" * 43, "Bearer not-even-a-token", "Basic dXNlcjpwYXNz", "Bearer",
])
def test_wrong_tokens_get_401(client: FlaskClient, app: Flask, header: str) -> None:
    response = client.post("/api/v1/elicitations", json=body(),
                           headers={"Authorization": header})
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith('Bearer realm="gateway"')
    assert elicitation_count(app) == 0


@pytest.mark.parametrize("query", ["access_token=", "token=", "x=gw_", "x=bar&x=gw_"])
def test_a_token_in_the_query_string_is_refused(
    client: FlaskClient, app: Flask, registered: Registered, query: str,
) -> None:
    value = registered.api_token if query.endswith("=") else registered.api_token[3:]
    response = client.post(f"/api/v1/elicitations?{query}{value}", json=body(),
                           headers={"Authorization": f"Bearer {registered.api_token}"})
    problem = assert_problem(response, 400, "Authorization header", "rotate")
    assert registered.api_token not in problem["detail"]
    assert elicitation_count(app) == 0


def test_tokens_are_stored_only_as_keyed_digests(
    app: Flask, registered: Registered, settings: Settings,
) -> None:
    with app.app_context():
        stored = db.session().scalars(select(ApiToken.digest)).all()
        dump = "\n".join(str(row) for table in db.Base.metadata.sorted_tables
                         for row in db.session().execute(select(table)))
    assert registered.api_token not in dump
    assert registered.webhook_secret not in dump
    assert stored == [clients.keyed_digest(settings.token_pepper, registered.api_token)]


def test_a_rotated_token_works_beside_the_old_one_until_that_is_revoked(
    client: FlaskClient, app: Flask, registered: Registered, settings: Settings,
) -> None:
    with app.app_context(), db.transaction() as session:
        record, new_token = clients.rotate_token(
            session, SystemClock(), pepper=settings.token_pepper, client_ref=registered.id,
            actor="test")
        old_id = next(t.id for t in session.get(Client, registered.id).tokens  # type: ignore[union-attr]
                      if t.id != record.id)
    old, new = Api(client, registered.api_token), Api(client, new_token)
    assert old.get("/api/v1/elicitations").status_code == 200
    assert new.get("/api/v1/elicitations").status_code == 200
    with app.app_context(), db.transaction() as session:
        clients.revoke_token(session, SystemClock(), client_ref=registered.id,
                             token_id=old_id, actor="test")
    assert_problem(old.get("/api/v1/elicitations"), 401, "revoked")
    assert new.get("/api/v1/elicitations").status_code == 200


def test_a_disabled_client_is_refused(client: FlaskClient, app: Flask,
                                      registered: Registered) -> None:
    with app.app_context(), db.transaction() as session:
        clients.disable_client(session, SystemClock(), client_ref=registered.id, actor="test")
    response = Api(client, registered.api_token).post("/api/v1/elicitations", body())
    assert_problem(response, 401, "disabled")
    assert elicitation_count(app) == 0


def test_the_openapi_document_needs_no_token(client: FlaskClient) -> None:
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    assert response.get_json()["openapi"].startswith("3.1")


def test_the_api_is_not_served_over_plain_http(app: Flask, registered: Registered) -> None:
    from tests.conftest import client_for

    plain = client_for(app, "http://gateway.test")
    response = plain.get("/api/v1/elicitations",
                         headers={"Authorization": f"Bearer {registered.api_token}"})
    assert_problem(response, 403, "rotate")


def test_a_read_checks_the_token_in_its_own_statement_with_the_same_answers(
    client: FlaskClient, app: Flask, registered: Registered,
) -> None:
    # A read looks its row up in the statement that checks the token; the row
    # being there must change nothing about who is refused, or how.
    api = Api(client, registered.api_token)
    created = api.post("/api/v1/elicitations", body()).get_json()
    path = f"/api/v1/elicitations/{created['id']}"
    assert api.get(path).get_json()["id"] == created["id"]
    no_token = client.get(path)
    assert_problem(no_token, 401, "Authorization: Bearer")
    assert no_token.headers["WWW-Authenticate"] == 'Bearer realm="gateway"'
    assert_problem(Api(client, "gw_" + "A" * 43).get(path), 401, "unknown or revoked")
    with app.app_context(), db.transaction() as session:
        [token] = session.get(Client, registered.id).tokens  # type: ignore[union-attr]
        clients.revoke_token(session, SystemClock(), client_ref=registered.id,
                             token_id=token.id, actor="test")
    revoked = api.get(path)
    assert_problem(revoked, 401, "unknown or revoked")
    assert 'error="invalid_token"' in revoked.headers["WWW-Authenticate"]
    assert created["id"] not in revoked.get_data(as_text=True)


def test_a_read_by_a_disabled_client_is_refused_though_the_row_is_its_own(
    client: FlaskClient, app: Flask, registered: Registered,
) -> None:
    api = Api(client, registered.api_token)
    created = api.post("/api/v1/elicitations", body()).get_json()
    with app.app_context(), db.transaction() as session:
        clients.disable_client(session, SystemClock(), client_ref=registered.id, actor="test")
    assert_problem(api.get(f"/api/v1/elicitations/{created['id']}"), 401, "disabled")
