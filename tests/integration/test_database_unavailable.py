"""A database the gateway cannot reach: 503 with Retry-After, one log line, no trace."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from flask import Flask
from flask.testing import FlaskClient
from requests.adapters import BaseAdapter
from requests.structures import CaseInsensitiveDict

from gateway.app import create_app
from gateway.client import GatewayClient, TemporarilyUnavailable
from gateway.clock import FixedClock
from gateway.identity.sessions import COOKIE_NAME
from gateway.settings import Settings
from tests.conftest import client_for


@pytest.fixture
def unreachable_app(make_settings: Callable[..., Settings], database_url: str,
                    clock: FixedClock, tmp_path: Path) -> Iterator[Flask]:
    """The gateway with a database that refuses every connection, of the run's kind."""
    if database_url.startswith("postgresql"):
        url = "postgresql+psycopg://postgres@127.0.0.1:1/gateway"  # nothing listens on port 1
    else:
        url = f"sqlite:///{tmp_path}/no-such-folder/gateway.db"
    app = create_app(make_settings(GATEWAY_DATABASE_URL=url), clock=clock)
    yield app
    app.extensions["gateway.engine"].dispose()


@pytest.fixture
def client(unreachable_app: Flask) -> FlaskClient:
    return client_for(unreachable_app)


def test_the_api_answers_503_with_retry_after(client: FlaskClient,
                                              caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        answer = client.get("/api/v1/elicitations/el_abc",
                            headers={"Authorization": "Bearer gw_" + "a" * 43})
    assert answer.status_code == 503
    assert answer.headers["Retry-After"] == "5"
    assert answer.headers["Cache-Control"] == "no-store"
    assert answer.mimetype == "application/problem+json"
    problem = answer.get_json()
    assert problem["type"] == "urn:gateway:problem:database-unavailable"
    assert "Try again in 5 seconds" in problem["detail"]
    assert "127.0.0.1" not in answer.get_data(as_text=True)  # no inside detail for callers
    unavailable = [r for r in caplog.records if "database unavailable" in r.getMessage()]
    assert len(unavailable) == 1
    assert unavailable[0].exc_info is None
    assert "\n" not in unavailable[0].getMessage()


def test_a_page_whose_session_cannot_be_read_answers_503(
        client: FlaskClient, caplog: pytest.LogCaptureFixture) -> None:
    # The session is read while the request is set up, before any view runs.
    client.set_cookie(COOKIE_NAME, "some-session-token", domain="gateway.test")
    with caplog.at_level(logging.WARNING):
        page = client.get("/account")
    # One warning; no traceback, and no error from saving the session it never had.
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert page.status_code == 503
    assert page.headers["Retry-After"] == "5"
    assert page.mimetype == "text/html"
    assert "Try again in 5 seconds" in page.get_data(as_text=True)


def test_a_form_post_answers_503_and_no_cookie_is_set(client: FlaskClient) -> None:
    client.set_cookie(COOKIE_NAME, "some-session-token", domain="gateway.test")
    answer = client.post("/e/el_abc", data={"action": "decline"})
    assert answer.status_code == 503
    assert "Set-Cookie" not in answer.headers


def test_every_operation_that_checks_a_token_documents_503(client: FlaskClient) -> None:
    document = client.get("/api/v1/openapi.json").get_json()  # served without the database
    operations = [(path, method, operation) for path, item in document["paths"].items()
                  for method, operation in item.items()]
    assert operations
    for path, method, operation in operations:
        checks_token = operation["security"] != []
        assert ("503" in operation["responses"]) == checks_token, (method, path)


class ThroughTestClient(BaseAdapter):
    """Hands the SDK's requests to a Flask test client: the gateway's real answers, no socket."""

    def __init__(self, client: FlaskClient) -> None:
        super().__init__()
        self._client = client

    def send(self, request: requests.PreparedRequest, *args: Any,
             **kwargs: Any) -> requests.Response:
        url = urlsplit(request.url or "")
        answer = self._client.open(url.path + (f"?{url.query}" if url.query else ""),
                                   method=request.method, headers=dict(request.headers),
                                   data=request.body)
        response = requests.Response()
        response.status_code = answer.status_code
        response.headers = CaseInsensitiveDict(dict(answer.headers))
        response._content = answer.get_data()
        response.url = request.url or ""
        response.request = request
        return response

    def close(self) -> None:
        """Nothing to close: no connection was opened."""


def test_the_sdk_raises_temporarily_unavailable_with_retry_after(client: FlaskClient) -> None:
    session = requests.Session()
    session.mount("https://", ThroughTestClient(client))
    sdk = GatewayClient("https://gateway.test", "gw_" + "a" * 43, session=session)
    with pytest.raises(TemporarilyUnavailable) as unavailable:
        sdk.list_elicitations()
    assert unavailable.value.status == 503
    assert unavailable.value.code == "database-unavailable"
    assert unavailable.value.retry_after == 5
