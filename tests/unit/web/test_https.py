"""HTTPS only, configured hosts only; proxies trusted exactly as far as configured."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from flask import Flask
from flask.testing import FlaskClient

from gateway.app import create_app
from gateway.settings import Settings
from tests.conftest import client_for


def plain(app: Flask) -> FlaskClient:
    return client_for(app, "http://gateway.test")


def test_page_over_plain_http_is_redirected_to_the_public_origin(app: Flask) -> None:
    response = plain(app).get("/e/abc?x=1")
    assert response.status_code == 301
    assert response.headers["Location"] == "https://gateway.test/e/abc?x=1"


def test_api_over_plain_http_is_refused_not_redirected(app: Flask) -> None:
    response = plain(app).post("/api/v1/elicitations", json={})
    assert response.status_code == 403
    assert "Location" not in response.headers
    assert response.mimetype == "application/problem+json"
    body = response.get_json()
    assert body["type"] == "urn:gateway:problem:https-required"
    assert "rotate" in body["detail"]


@pytest.mark.parametrize("path", ["/login", "/e/abc", "/e/abc/connect", "/logout"])
def test_a_form_over_plain_http_is_refused_not_redirected(app: Flask, path: str) -> None:
    # A redirect would drop the form (301, 303) or send again over https what
    # already crossed in the clear (307, 308): the page says what happened.
    response = plain(app).post(path, data={"username": "alice", "password": "pw"})
    assert response.status_code == 403
    assert "Location" not in response.headers
    assert response.mimetype == "text/html"
    text = response.get_data(as_text=True)
    assert "came over plain HTTP and was not processed" in text
    assert "https://" in text


def test_a_cross_site_form_is_refused_as_such_before_its_token_is_read(
    client: FlaskClient,
) -> None:
    # Another site's form has no CSRF token of ours: the answer names the
    # real reason, not the missing token.
    response = client.post("/login", data={"username": "alice", "password": "pw"},
                           headers={"Sec-Fetch-Site": "cross-site"})
    assert response.status_code == 403
    assert "sent from another site" in response.get_data(as_text=True)


def test_health_probes_answer_over_plain_http(app: Flask) -> None:
    assert plain(app).get("/healthz").status_code == 200


def test_foreign_host_gets_400(client: FlaskClient) -> None:
    response = client.get("/", headers={"Host": "evil.example"})
    assert response.status_code == 400
    assert response.mimetype == "text/html"


def test_foreign_host_on_the_api_gets_a_problem(client: FlaskClient) -> None:
    response = client.get("/api/v1/elicitations", headers={"Host": "evil.example"})
    assert response.status_code == 400
    assert response.mimetype == "application/problem+json"


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_health_probes_answer_whatever_the_host(app: Flask, path: str) -> None:
    # A load balancer probes each backend by its address, not the public name.
    for origin in ("https://10.0.0.5:8443", "http://10.0.0.5"):
        assert client_for(app, origin).get(path).status_code == 200


def test_the_host_is_compared_whatever_its_case(make_settings: Callable[..., Settings]) -> None:
    app = create_app(make_settings(GATEWAY_ALLOWED_HOSTS="Portal.Example.com"))
    for origin in ("https://GATEWAY.test", "https://portal.example.COM:8443"):
        assert client_for(app, origin).get("/").status_code == 200
    assert client_for(app, "https://GATEWAY.evil").get("/").status_code == 400


def test_allowed_hosts_are_accepted_with_any_port(make_settings: Callable[..., Settings]) -> None:
    app = create_app(make_settings(GATEWAY_ALLOWED_HOSTS="10.1.2.3"))
    client = client_for(app, "https://10.1.2.3:8443")
    assert client.get("/").status_code == 200


def test_forwarded_proto_is_ignored_without_proxy_hops(app: Flask) -> None:
    response = plain(app).get("/", headers={"X-Forwarded-Proto": "https"})
    assert response.status_code == 301


def test_forwarded_headers_are_trusted_for_the_configured_hops(
    make_settings: Callable[..., Settings],
) -> None:
    app = create_app(make_settings(GATEWAY_PROXY_HOPS="1"))
    client = plain(app)
    assert client.get("/", headers={"X-Forwarded-Proto": "https"}).status_code == 200
    assert client.get("/", headers={"X-Forwarded-Proto": "http"}).status_code == 301
    forged_host = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "evil.example"}
    assert client.get("/", headers=forged_host).status_code == 400
