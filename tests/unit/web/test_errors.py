"""Errors: problem+json under /api/, an HTML page elsewhere, nothing internal on a 500."""

from __future__ import annotations

from flask import Flask
from flask.testing import FlaskClient

from gateway.app import csrf
from gateway.web.errors import GatewayError
from tests.conftest import client_for


class QuotaExceeded(GatewayError):
    status = 409
    code = "quota-exceeded"
    title = "Quota exceeded"


def add_route(app: Flask, path: str, error: Exception) -> FlaskClient:
    def fail() -> str:
        raise error

    app.add_url_rule(path, endpoint=path, view_func=fail, methods=["GET", "POST"])
    return client_for(app, "https://gateway.test")


def test_api_404_is_a_problem(client: FlaskClient) -> None:
    response = client.get("/api/v1/nothing-here")
    assert response.status_code == 404
    assert response.mimetype == "application/problem+json"
    body = response.get_json()
    assert body["status"] == 404
    assert body["title"] == "Not Found"
    assert body["request_id"] == response.headers["X-Request-Id"]


def test_page_404_is_html(client: FlaskClient) -> None:
    response = client.get("/nothing-here")
    assert response.status_code == 404
    assert response.mimetype == "text/html"
    assert b"Not Found" in response.data


def test_domain_error_on_the_api_names_the_problem(app: Flask) -> None:
    client = add_route(app, "/api/v1/quota", QuotaExceeded("You used 10 of 10 links."))
    body = client.get("/api/v1/quota").get_json()
    assert body == {
        "type": "urn:gateway:problem:quota-exceeded",
        "title": "Quota exceeded",
        "status": 409,
        "detail": "You used 10 of 10 links.",
        "request_id": body["request_id"],
    }


def test_unexpected_error_reveals_nothing_on_a_page(app: Flask) -> None:
    app.config["PROPAGATE_EXCEPTIONS"] = False
    client = add_route(app, "/boom", RuntimeError("db password is hunter2"))
    response = client.get("/boom")
    assert response.status_code == 500
    assert b"hunter2" not in response.data
    assert b"Traceback" not in response.data
    assert b"RuntimeError" not in response.data
    assert response.headers["X-Request-Id"].encode() in response.data


def test_unexpected_error_reveals_nothing_on_the_api(app: Flask) -> None:
    app.config["PROPAGATE_EXCEPTIONS"] = False
    client = add_route(app, "/api/v1/boom", RuntimeError("db password is hunter2"))
    response = client.get("/api/v1/boom")
    assert response.status_code == 500
    assert response.mimetype == "application/problem+json"
    assert "hunter2" not in response.get_data(as_text=True)
    assert response.get_json()["type"] == "urn:gateway:problem:internal-error"


def test_body_over_64_kib_is_refused_with_413(app: Flask) -> None:
    from flask import request

    def echo() -> str:
        return str(len(request.get_data()))

    # The API authenticates by bearer token, not cookie: its routes are CSRF-exempt.
    app.add_url_rule("/api/v1/echo", view_func=csrf.exempt(echo), methods=["POST"])
    client = client_for(app, "https://gateway.test")
    response = client.post("/api/v1/echo", data=b"x" * (64 * 1024 + 1),
                           content_type="application/json")
    assert response.status_code == 413
    assert response.mimetype == "application/problem+json"
    assert client.post("/api/v1/echo", data=b"x" * 1024).status_code == 200
