"""The documented nginx in front of the gateway: whose address the gateway records, and why.

Each test starts nginx with docs/deployment/nginx.conf (see conftest.py) in
front of fresh ``gateway serve --no-worker --no-tls`` instances with
``GATEWAY_PROXY_HOPS=1``, as docs/deployment/gateway-web.service runs them.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import BrowserContext, expect
from sqlalchemy import Engine, select

from gateway.app import MAX_REQUEST_BYTES
from gateway.audit.models import AuditEvent
from tests.browser.conftest import log_in
from tests.conftest import Registered
from tests.integration.conftest import Server, tls_context
from tests.integration.nginx.conftest import FORGED_ADDRESS, PROXY_ADDRESS, Edge, Nginx

pytestmark = pytest.mark.slow

BROWSER_ADDRESS = "127.0.0.1"  # where Chromium and the API calls connect to nginx from


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: Any


def call(edge: Edge, certfile: Path, method: str, path: str, token: str = "",
         body: bytes | None = None, timeout: float = 15) -> Reply:
    """One request to nginx over TLS, as an MCP server sends it."""
    connection = http.client.HTTPSConnection("localhost", edge.https_port, timeout=timeout,
                                             context=tls_context(certfile))
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        raw = response.read()
    finally:
        connection.close()
    is_json = response.headers.get_content_subtype().endswith("json")
    return Reply(response.status, response.headers, json.loads(raw) if is_json and raw else raw)


def ask_for_key(edge: Edge, certfile: Path, mcp: Registered, username: str) -> Reply:
    payload = {"subject": {"iss": edge.origin, "sub": username}, "kind": "api_key",
               "credential_type": "generic", "message": "Connect your weather API key",
               "reuse_pending": False}
    return call(edge, certfile, "POST", "/api/v1/elicitations", mcp.api_token,
                json.dumps(payload).encode())


def source_ips(engine: Engine) -> dict[str, set[str | None]]:
    """The addresses the audit trail recorded, by action."""
    with engine.connect() as connection:
        rows = connection.execute(select(AuditEvent.action, AuditEvent.source_ip)).all()
    found: dict[str, set[str | None]] = {}
    for action, source_ip in rows:
        found.setdefault(action, set()).add(source_ip)
    return found


def logged(server: Server, text: str, timeout: float = 5) -> int:
    """How many lines of the server's log hold ``text``, once at least one does."""
    deadline = time.monotonic() + timeout
    while (count := server.output().count(text)) == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    return count


@pytest.mark.skipif(
    not os.environ.get("TEST_DATABASE_URL", "").startswith("postgresql"),
    reason="two instances behind nginx share a PostgreSQL database (set TEST_DATABASE_URL; "
           "./dev test runs the suite on PostgreSQL too)")
def test_an_api_key_flow_through_nginx_records_the_browsers_address(
    start_instances: Callable[[int], list[Server]], start_nginx: Callable[..., Nginx],
    edge: Edge, certificate: tuple[Path, Path], register: Callable[..., Registered],
    create_user: Callable[[], str], context: BrowserContext, engine: Engine,
) -> None:
    certfile, _ = certificate
    a, b = start_instances(2)
    nginx = start_nginx([a.port, b.port])
    mcp = register()
    username = create_user()
    created = ask_for_key(edge, certfile, mcp, username)
    assert created.status == 201, created.body
    elicitation_id, link = created.body["id"], created.body["url"]
    assert link == f"{edge.origin}/e/{elicitation_id}"

    with ThreadPoolExecutor(1) as pool:
        # A long-poll held through nginx while the user works in the browser.
        waiting = pool.submit(call, edge, certfile, "GET",
                              f"/api/v1/elicitations/{elicitation_id}?wait=30",
                              mcp.api_token, timeout=40)
        page = context.new_page()
        page.goto(link)
        expect(page).to_have_url(re.compile(re.escape(f"{edge.origin}/login?next=")))
        log_in(page, username)
        expect(page).to_have_url(link)
        key = f"wx-live-{secrets.token_hex(12)}"
        page.get_by_label("API key").fill(key)
        with page.expect_navigation():
            page.get_by_role("button", name="Save key").click()
        expect(page.get_by_role("heading", level=1)).to_have_text("Done")
        woken = waiting.result(timeout=40)
    assert woken.status == 200, woken.body
    assert woken.body["status"] == "completed", "the long-poll through nginx did not see the end"

    listed = call(edge, certfile, "GET", f"/api/v1/credentials?subject_sub={username}",
                  mcp.api_token)
    [credential] = listed.body["items"]
    revealed = call(edge, certfile, "POST", f"/api/v1/credentials/{credential['id']}/reveal",
                    mcp.api_token)
    assert revealed.body["secret"] == key

    # The audit trail names the browser's address: not nginx's (127.0.0.3),
    # not what the browser wrote into X-Forwarded-For itself.
    recorded = source_ips(engine)
    for action in ("login", "elicitation.opened", "credential.captured",
                   "elicitation.completed", "elicitation.created", "credential.revealed"):
        assert recorded.get(action) == {BROWSER_ADDRESS}, \
            f"{action} was recorded from {recorded.get(action)}, not {BROWSER_ADDRESS}"
    everywhere = set().union(*recorded.values())
    assert PROXY_ADDRESS not in everywhere, recorded
    assert FORGED_ADDRESS not in everywhere, recorded

    # Both instances served the flow, and each trusted nginx's headers.
    for server in (a, b):
        assert f'gunicorn.access: {BROWSER_ADDRESS} "' in server.output(), \
            f"instance on port {server.port} served nothing of the flow"
        assert "GATEWAY_PROXY_HOPS=1: trusting the last entry" in server.output()
        assert "but the request carried" not in server.output()
        assert PROXY_ADDRESS not in server.output()
    # nginx logs, as documented, without query strings (the long-poll's ?wait=30).
    access = nginx.access_log.read_text()
    assert f"GET /api/v1/elicitations/{elicitation_id} HTTP/1.1" in access
    assert "?" not in access
    for server in (a, b):
        assert f"upstream=127.0.0.1:{server.port}" in access


def test_nginx_keeps_the_gateways_rules_on_plain_http_and_on_body_size(
    start_instances: Callable[[int], list[Server]], start_nginx: Callable[..., Nginx],
    edge: Edge, certificate: tuple[Path, Path], register: Callable[..., Registered],
) -> None:
    certfile, _ = certificate
    [server] = start_instances(1)
    start_nginx([server.port])
    plain = http.client.HTTPConnection("localhost", edge.http_port, timeout=10)
    try:
        plain.request("GET", "/e/abc?x=1")
        page = plain.getresponse()
        page.read()
        plain.request("POST", "/api/v1/elicitations", body=b"{}",
                      headers={"Content-Type": "application/json"})
        api = plain.getresponse()
        api.read()
        plain.request("POST", "/login", body=b"username=alice&password=pw",
                      headers={"Content-Type": "application/x-www-form-urlencoded"})
        form = plain.getresponse()
        form.read()
    finally:
        plain.close()
    # Over plain http a page is sent to https; an API call and a form are refused, not
    # redirected (a redirect would drop the form, or send it again after it crossed in
    # the clear).
    assert page.status == 301
    assert page.headers["Location"] == f"{edge.origin}/e/abc?x=1"
    assert api.status == 403
    assert api.headers["Content-Type"] == "application/problem+json"
    assert "Location" not in api.headers
    assert form.status == 403
    assert form.headers["Content-Type"].startswith("text/html")
    assert "Location" not in form.headers

    # What docs/deployment.md says of caching through nginx: pages never, static files
    # (no secret in them) for an hour.
    assert call(edge, certfile, "GET", "/login").headers["Cache-Control"] == "no-store"
    static = call(edge, certfile, "GET", "/static/gateway.css")
    assert static.status == 200
    assert static.headers["Cache-Control"] == "public, max-age=3600"

    # A body the gateway accepts by size reaches it; one byte more is stopped by nginx.
    token = register().api_token
    largest = call(edge, certfile, "POST", "/api/v1/elicitations", token,
                   b" " * MAX_REQUEST_BYTES)
    assert largest.status == 400, largest.body
    assert largest.headers["Content-Type"] == "application/problem+json"
    too_large = call(edge, certfile, "POST", "/api/v1/elicitations", token,
                     b" " * (MAX_REQUEST_BYTES + 1))
    assert too_large.status == 413
    assert too_large.headers["Content-Type"].startswith("text/html")  # nginx's own page


def test_an_nginx_sending_no_x_forwarded_for_leaves_the_socket_address_and_says_so_once(
    start_instances: Callable[[int], list[Server]], start_nginx: Callable[..., Nginx],
    edge: Edge, certificate: tuple[Path, Path], register: Callable[..., Registered],
    engine: Engine,
) -> None:
    certfile, _ = certificate
    [server] = start_instances(1)
    start_nginx([server.port], omit_headers=("X-Forwarded-For",))
    mcp = register()
    for number in range(3):
        assert ask_for_key(edge, certfile, mcp, f"user-{number}").status == 201
    # No header to trust: the connection's own address, nginx's, is all there is.
    assert source_ips(engine)["elicitation.created"] == {PROXY_ADDRESS}
    said = (f"GATEWAY_PROXY_HOPS=1 but the request carried no X-Forwarded-For: using the "
            f"socket address {PROXY_ADDRESS} instead")
    assert logged(server, said) == 1, server.output()
    assert "carried no X-Forwarded-Proto" not in server.output()  # nginx sent that one


def test_an_nginx_sending_no_forwarded_headers_is_not_taken_for_https(
    start_instances: Callable[[int], list[Server]], start_nginx: Callable[..., Nginx],
    edge: Edge, certificate: tuple[Path, Path], register: Callable[..., Registered],
) -> None:
    certfile, _ = certificate
    [server] = start_instances(1)
    start_nginx([server.port], omit_headers=("X-Forwarded-For", "X-Forwarded-Proto",
                                             "X-Forwarded-Host", "X-Forwarded-Port"))
    token = register().api_token
    for _ in range(2):
        # nginx spoke plain http to the instance and said nothing else: refused.
        refused = call(edge, certfile, "GET", "/api/v1/elicitations", token)
        assert refused.status == 403
        assert refused.body["type"] == "urn:gateway:problem:https-required"
    for header, fallback in [("X-Forwarded-For", f"the socket address {PROXY_ADDRESS}"),
                             ("X-Forwarded-Proto", "the connection's scheme http")]:
        said = f"the request carried no {header}: using {fallback} instead"
        assert logged(server, said) == 1, server.output()
