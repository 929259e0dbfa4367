"""Browsers, local users and elicitations for the portal's tests."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from gateway import db
from gateway.clock import SystemClock
from gateway.identity import service as identity
from tests.conftest import Api, client_for

PASSWORD = "correct horse battery staple"
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_of(page: TestResponse) -> str:
    """The CSRF token a page's form carries."""
    found = _CSRF.search(page.get_data(as_text=True))
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


class Browser:
    """One browser: its own cookie jar, logging in through the real form."""

    def __init__(self, client: FlaskClient) -> None:
        self.client = client

    def get(self, path: str, **kwargs: Any) -> TestResponse:
        return self.client.get(path, **kwargs)

    def post_form(self, path: str, form: dict[str, str], *, page: str | None = None,
                  **kwargs: Any) -> TestResponse:
        """Post ``form`` with the CSRF token of ``page`` (default: ``path`` itself)."""
        token = csrf_of(self.client.get(page or path))
        return self.client.post(path, data={"csrf_token": token, **form}, **kwargs)

    def log_in(self, username: str, password: str = PASSWORD,
               next_path: str = "/") -> TestResponse:
        return self.post_form("/login", {"username": username, "password": password,
                                         "next": next_path}, page="/login")

    @property
    def session_cookie(self) -> str | None:
        cookie = self.client.get_cookie("__Host-gateway_session", domain="gateway.test")
        return cookie.value if cookie else None


@pytest.fixture
def make_user(app: Flask) -> Callable[..., str]:
    """Create local accounts with the test password."""

    def make(username: str, password: str = PASSWORD) -> str:
        with app.app_context(), db.transaction() as session:
            identity.create_user(session, SystemClock(), username=username, password=password,
                                 actor="test")
        return username

    return make


@pytest.fixture
def browser(app: Flask) -> Callable[[], Browser]:
    """New browsers, each with its own cookies."""
    return lambda: Browser(client_for(app))


@pytest.fixture
def alice(make_user: Callable[..., str]) -> str:
    return make_user("alice")


@pytest.fixture
def bob(make_user: Callable[..., str]) -> str:
    return make_user("bob")


@pytest.fixture
def link_for(api: Api, settings: Any) -> Callable[..., dict[str, Any]]:
    """Create an API-key elicitation for a local user, as their MCP server would."""

    def make(username: str, **changes: Any) -> dict[str, Any]:
        response = api.post("/api/v1/elicitations", {
            "subject": {"iss": settings.public_url, "sub": username}, "kind": "api_key",
            "credential_type": "generic", "message": "Connect your weather API key",
            "reuse_pending": False, **changes})
        assert response.status_code == 201, response.get_data(as_text=True)
        created: dict[str, Any] = response.get_json()
        return created

    return make
