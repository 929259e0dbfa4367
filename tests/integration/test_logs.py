"""``gateway serve``'s log: access and app lines in either format, with request ids, and
never a secret a request carried (query string, Authorization header, form body).
"""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import pytest

from gateway.serving.tls import dev_certificate_paths
from tests.integration.conftest import Result, Server, tls_context
from tests.integration.log_canary import assert_nowhere, records, tell_tales

pytestmark = pytest.mark.slow

QUERY_CANARY = "canary-query-4f1d9a0c7e"
HEADER_CANARY = "gw_canaryHeader8b2e6d1f0a9c"
FORM_CANARY = "canary-password-5c3b7e9d1a"
SECRET_CANARY = "canary-key-2a7f4c8e1b6d"
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Caller:
    """Plain HTTPS requests to a served gateway, one connection each, with a cookie jar."""

    def __init__(self, server: Server, instance_path: Path | None) -> None:
        self.server = server
        self.context = tls_context(dev_certificate_paths(instance_path)[0]) \
            if instance_path else None
        self.cookies: dict[str, str] = {}

    def request(self, method: str, path: str, headers: dict[str, str] | None = None,
                form: dict[str, str] | None = None) -> Answer:
        connection: http.client.HTTPConnection
        if self.context is None:
            connection = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=10)
        else:
            connection = http.client.HTTPSConnection("localhost", self.server.port, timeout=10,
                                                     context=self.context)
        sent = {"Host": "localhost", **(headers or {})}
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if form is not None:
            body = urllib.parse.urlencode(form)
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        answer = Answer(response.status, response.headers, response.read())
        connection.close()
        for header in answer.headers.get_all("Set-Cookie") or []:
            self.cookies.update({k: m.value for k, m in SimpleCookie(header).items()})
        return answer

    def log_in(self, username: str, password: str) -> Answer:
        page = self.request("GET", "/login").body.decode()
        found = _CSRF.search(page)
        assert found, "the login page has no CSRF token"
        return self.request("POST", "/login", form={
            "csrf_token": found.group(1), "username": username, "password": password})


def stopped_output(server: Server) -> str:
    """Everything the server wrote, once it has stopped and flushed it."""
    server.process.terminate()
    server.process.wait(timeout=30)
    return server.output()


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_secrets_a_request_carries_never_reach_the_log(
    start_server: Callable[..., Server], invoke_gateway: Callable[..., Result],
    cli_environ: dict[str, str], instance_path: Path, log_format: str,
) -> None:
    environ = {**cli_environ, "GATEWAY_LOG_FORMAT": log_format, "GATEWAY_LOG_LEVEL": "debug"}
    minted = json.loads(invoke_gateway("clients", "create", "Logged MCP", "--webhook-url",
                                       "https://mcp.example.com/hooks", "--json",
                                       env=environ).stdout)
    caller = Caller(start_server(env=environ), instance_path)

    in_query = caller.request("GET", f"/api/v1/elicitations?access_token={QUERY_CANARY}")
    assert in_query.status == 400
    assert caller.request("GET", "/api/v1/elicitations", {
        "Authorization": f"Bearer {minted['api_token']}"}).status == 200
    unknown = caller.request("GET", "/api/v1/elicitations", {
        "Authorization": f"Bearer {HEADER_CANARY}"})
    assert unknown.status == 401
    assert caller.log_in("alice", FORM_CANARY).status == 401
    caller.request("POST", "/e/el_0123456789abcdef0123", form={
        "action": "submit", "secret": SECRET_CANARY})
    output = stopped_output(caller.server)

    assert_nowhere([QUERY_CANARY, FORM_CANARY, SECRET_CANARY, *tell_tales(HEADER_CANARY),
                    *tell_tales(minted["api_token"]), *tell_tales(minted["webhook_secret"])],
                   log=output)

    lines = records(output, log_format)
    assert any(line["level"] == "debug" for line in lines)
    request_id = unknown.json()["request_id"]
    assert request_id == unknown.headers["X-Request-Id"]
    if log_format == "text":
        [line] = [r["line"] for r in lines if f"request_id={request_id}" in r["line"]]
        assert 'gunicorn.access: 127.0.0.1 "GET /api/v1/elicitations HTTP/1.1" 401' in line
        return
    [access] = [line for line in lines if line.get("request_id") == request_id]
    assert access["logger"] == "gunicorn.access"
    assert {k: access[k] for k in ("method", "path", "status", "remote_addr")} == {
        "method": "GET", "path": "/api/v1/elicitations", "status": 401,
        "remote_addr": "127.0.0.1"}
    assert isinstance(access["duration_ms"], int)
    # One access line per request, the path without its query string.
    assert [(line["method"], line["path"], line["status"]) for line in lines
            if line["logger"] == "gunicorn.access"] == [
        ("GET", "/api/v1/elicitations", 400), ("GET", "/api/v1/elicitations", 200),
        ("GET", "/api/v1/elicitations", 401), ("GET", "/login", 200), ("POST", "/login", 401),
        ("POST", "/e/el_0123456789abcdef0123", 400)]


def test_behind_a_proxy_the_access_line_names_the_client(
    start_server: Callable[..., Server], cli_environ: dict[str, str],
) -> None:
    server = start_server("--no-tls", env={**cli_environ, "GATEWAY_PROXY_HOPS": "1",
                                           "GATEWAY_LOG_FORMAT": "json"})
    answer = Caller(server, None).request("GET", "/", {
        "X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"})
    assert answer.status == 200
    # The worker runs in a process of its own, which takes a moment to start.
    deadline = time.monotonic() + 30
    while '"worker started"' not in server.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = records(stopped_output(server), "json")
    [access] = [line for line in lines if line["logger"] == "gunicorn.access"]
    assert access["remote_addr"] == "203.0.113.9"
    assert access["request_id"] == answer.headers["X-Request-Id"]
    # gunicorn's and the worker's own lines come in the same format.
    assert any(line["logger"] == "gunicorn.error" and "Booting worker" in line["message"]
               for line in lines)
    assert any(line["logger"] == "gateway.worker" and line["message"] == "worker started"
               for line in lines)
