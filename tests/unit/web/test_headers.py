"""Security headers on every kind of response, and the CSP built as data."""

from __future__ import annotations

import re

import pytest
from flask import Flask, render_template_string
from flask.testing import FlaskClient

from gateway.web.headers import build_csp, csp_allow
from tests.conftest import client_for

EXPECTED = {
    "Strict-Transport-Security": "max-age=31536000; includeSubDomains",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def csp_directives(header: str) -> dict[str, list[str]]:
    parts = (part.strip().split() for part in header.split(";"))
    return {part[0]: part[1:] for part in parts if part}


@pytest.mark.parametrize("path", ["/", "/healthz", "/readyz", "/no-such-page",
                                  "/api/v1/no-such-thing"])
def test_every_response_carries_the_security_headers(client: FlaskClient, path: str) -> None:
    response = client.get(path)
    for name, value in EXPECTED.items():
        assert response.headers[name] == value
    assert response.headers["Cache-Control"] == "no-store"
    csp = csp_directives(response.headers["Content-Security-Policy"])
    assert csp["default-src"] == ["'none'"]
    assert csp["object-src"] == ["'none'"]
    assert csp["base-uri"] == ["'none'"]
    assert csp["frame-ancestors"] == ["'none'"]
    assert csp["form-action"] == ["'self'"]
    # None of these pages has a script, so none may run.
    assert csp["script-src"] == ["'none'"]


def _scripted_page_client(app: Flask) -> FlaskClient:
    app.add_url_rule("/scripted", view_func=lambda: render_template_string(
        '<script nonce="{{ csp_nonce() }}" src="/static/reveal.js"></script>'))
    return client_for(app, "https://gateway.test")


def test_a_page_with_a_script_allows_exactly_its_nonce(app: Flask) -> None:
    response = _scripted_page_client(app).get("/scripted")
    csp = csp_directives(response.headers["Content-Security-Policy"])
    assert len(csp["script-src"]) == 1
    match = re.fullmatch(r"'nonce-([A-Za-z0-9_-]{24})'", csp["script-src"][0])
    assert match, csp["script-src"]
    assert f'nonce="{match.group(1)}"' in response.get_data(as_text=True)


def test_nonce_is_new_for_every_response(app: Flask) -> None:
    client = _scripted_page_client(app)
    nonces = {client.get("/scripted").headers["Content-Security-Policy"] for _ in range(5)}
    assert len(nonces) == 5


def test_static_files_may_be_cached_but_pages_may_not(client: FlaskClient) -> None:
    with client.get("/static/gateway.css") as response:
        assert response.status_code == 200
        assert response.headers["Cache-Control"] == "public, max-age=3600"
        assert response.headers["X-Content-Type-Options"] == "nosniff"


def test_a_view_can_widen_one_directive_visibly() -> None:
    @csp_allow("form-action", "https://checkout.stripe.com")
    def view() -> None: ...

    csp = csp_directives(build_csp("abc", view._csp_extra))  # type: ignore[attr-defined]
    assert csp["form-action"] == ["'self'", "https://checkout.stripe.com"]
    assert csp["script-src"] == ["'nonce-abc'"]


def test_unknown_directive_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown CSP directive"):
        csp_allow("form-actoin", "https://example.com")


def test_widened_view_gets_its_sources_and_others_do_not(app: Flask) -> None:
    @csp_allow("img-src", "https://images.example")
    def widened() -> str:
        return "ok"

    app.add_url_rule("/widened", view_func=widened)
    client = client_for(app, "https://gateway.test")
    assert "https://images.example" in client.get("/widened").headers["Content-Security-Policy"]
    assert "https://images.example" not in client.get("/").headers["Content-Security-Policy"]
