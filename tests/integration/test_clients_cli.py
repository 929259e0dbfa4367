"""``gateway clients`` and ``gateway elicitations``, and a CLI-made client over real HTTPS."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.serving.tls import dev_certificate_paths
from tests.integration.conftest import Result, Server, tls_context

pytestmark = pytest.mark.slow

SUBJECT = {"iss": "https://auth.example.com", "sub": "user-42"}


def ok(result: Result) -> str:
    assert result.code == 0, result.stderr
    return result.stdout


def create_client(invoke_gateway: Callable[..., Result],
                  name: str = "Weather MCP") -> dict[str, Any]:
    minted: dict[str, Any] = json.loads(ok(invoke_gateway(
        "clients", "create", name, "--webhook-url", "https://mcp.example.com/hooks", "--json")))
    return minted


class Https:
    """Requests to a served gateway, verified against its development certificate."""

    def __init__(self, server: Server, instance_path: Path, token: str) -> None:
        self.port, self.token = server.port, token
        self.context = tls_context(dev_certificate_paths(instance_path)[0])

    def call(self, method: str, path: str, payload: Any = None,
             timeout: float = 10) -> tuple[int, dict[str, Any]]:
        connection = http.client.HTTPSConnection("localhost", self.port, timeout=timeout,
                                                 context=self.context)
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        data = json.dumps(payload) if payload is not None else None
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        answer = json.loads(response.read())
        connection.close()
        return response.status, answer


def test_create_prints_the_secrets_once_in_the_documented_shape(
    invoke_gateway: Callable[..., Result],
) -> None:
    ok(invoke_gateway("db", "upgrade"))
    minted = create_client(invoke_gateway)
    assert set(minted) == {"client_id", "name", "api_token", "webhook_secret"}
    assert minted["api_token"].startswith("gw_")
    assert len(minted["api_token"]) >= 3 + 43
    assert minted["webhook_secret"].startswith("whsec_")
    listing = ok(invoke_gateway("clients", "list"))
    shown = ok(invoke_gateway("clients", "show", minted["client_id"], "--json"))
    for output in (listing, shown):
        assert minted["api_token"] not in output
        assert minted["api_token"][3:20] not in output
        assert minted["webhook_secret"] not in output
    details = json.loads(shown)
    assert details["name"] == "Weather MCP"
    assert details["tokens"][0]["hint"].startswith("gw_")
    assert details["live_tokens"] == 1


def test_bad_input_stops_with_one_line_and_writes_nothing(
    invoke_gateway: Callable[..., Result],
) -> None:
    ok(invoke_gateway("db", "upgrade"))
    for args, words in [
        (("clients", "create", "x", "--credential-types", "nope"), "unknown credential type"),
        (("clients", "create", "x", "--webhook-url", "http://mcp.example.com/"), "plain http"),
        (("clients", "create", "x", "--webhook-url", "https://169.254.169.254/"), "refused"),
        (("clients", "create", "x", "--webhook-url", "https://10.1.2.3/hooks"), "private"),
        (("clients", "create", "x", "--webhook-url", "https://h:99999/"), "Port out of range"),
        (("clients", "create", "x", "--webhook-url", "https://[::1/"), "Invalid IPv6 URL"),
        (("clients", "create", "bad\nname"), "client name"),
        (("clients", "show", "nobody"), "no client"),
        (("elicitations", "show", "el_nothing"), "no elicitation"),
    ]:
        result = invoke_gateway(*args)
        assert result.code == 1, args
        assert words in result.stderr
        assert result.stderr.strip().count("\n") == 0, result.stderr
    assert json.loads(ok(invoke_gateway("clients", "list", "--json"))) == []
    create_client(invoke_gateway)
    again = invoke_gateway("clients", "create", "Weather MCP")
    assert again.code == 1
    assert "exists already" in again.stderr


def test_a_cli_client_works_over_https_end_to_end(
    invoke_gateway: Callable[..., Result], start_server: Callable[..., Server],
    instance_path: Path,
) -> None:
    ok(invoke_gateway("db", "upgrade"))
    minted = create_client(invoke_gateway)
    server = start_server()
    https = Https(server, instance_path, minted["api_token"])

    status, created = https.call("POST", "/api/v1/elicitations", {
        "subject": SUBJECT, "kind": "api_key", "credential_type": "generic",
        "message": "Connect your weather key"})
    assert status == 201
    assert created["url"].startswith("https://localhost:8443/e/")
    assert https.call("GET", f"/api/v1/elicitations/{created['id']}")[1]["status"] == "pending"

    # A long-poll, ended by the operator cancelling from the CLI.
    answer: dict[str, Any] = {}

    def long_poll() -> None:
        started = time.monotonic()
        answer["status"], answer["body"] = https.call(
            "GET", f"/api/v1/elicitations/{created['id']}?wait=20", timeout=30)
        answer["elapsed"] = time.monotonic() - started

    waiter = threading.Thread(target=long_poll)
    waiter.start()
    time.sleep(0.5)
    ok(invoke_gateway("elicitations", "cancel", created["id"]))
    waiter.join(timeout=25)
    assert answer["status"] == 200
    assert answer["body"]["status"] == "cancelled"
    assert answer["elapsed"] < 10

    listing = https.call("GET", "/api/v1/elicitations?status=cancelled")[1]
    assert [item["id"] for item in listing["items"]] == [created["id"]]
    status, _problem = https.call("POST", f"/api/v1/elicitations/{created['id']}/cancel")
    assert status == 409

    shown = json.loads(ok(invoke_gateway("elicitations", "show", created["id"], "--json")))
    assert shown["status"] == "cancelled"
    listed = json.loads(ok(invoke_gateway("elicitations", "list", "--json")))
    assert [item["id"] for item in listed["items"]] == [created["id"]]


def test_rotate_revoke_and_disable_take_effect_at_once(
    invoke_gateway: Callable[..., Result], start_server: Callable[..., Server],
    instance_path: Path,
) -> None:
    ok(invoke_gateway("db", "upgrade"))
    minted = create_client(invoke_gateway)
    old_token_id = json.loads(ok(invoke_gateway("clients", "show", minted["client_id"],
                                                "--json")))["tokens"][0]["token_id"]
    rotated = json.loads(ok(invoke_gateway("clients", "rotate-token", minted["client_id"],
                                           "--json")))
    server = start_server()
    old = Https(server, instance_path, minted["api_token"])
    new = Https(server, instance_path, rotated["api_token"])
    assert old.call("GET", "/api/v1/elicitations")[0] == 200
    assert new.call("GET", "/api/v1/elicitations")[0] == 200

    ok(invoke_gateway("clients", "revoke-token", minted["client_id"], old_token_id))
    assert old.call("GET", "/api/v1/elicitations")[0] == 401
    assert new.call("GET", "/api/v1/elicitations")[0] == 200

    ok(invoke_gateway("clients", "disable", "Weather MCP"))
    assert new.call("GET", "/api/v1/elicitations")[0] == 401
    shown = json.loads(ok(invoke_gateway("clients", "show", minted["client_id"], "--json")))
    assert shown["status"] == "disabled"


def test_set_webhook_url_checks_the_url_and_is_audited(
    invoke_gateway: Callable[..., Result],
) -> None:
    ok(invoke_gateway("db", "upgrade"))
    minted = create_client(invoke_gateway)
    moved = ok(invoke_gateway("clients", "set-webhook-url", "Weather MCP",
                              "https://mcp.example.com/v2/hooks"))
    assert moved == (f"client {minted['client_id']} (Weather MCP) sends its webhooks to "
                     "https://mcp.example.com/v2/hooks\n")
    refused = invoke_gateway("clients", "set-webhook-url", minted["client_id"],
                             "http://127.0.0.1:9/hooks")
    assert refused.code == 1
    assert refused.stderr.strip() == ("Error: webhook URL refused: plain http only to hosts "
                                      "listed in GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS")
    shown = json.loads(ok(invoke_gateway("clients", "show", minted["client_id"], "--json")))
    assert shown["webhook_url"] == "https://mcp.example.com/v2/hooks"
    [record] = json.loads(ok(invoke_gateway("audit", "--action", "client.webhook_url_changed",
                                            "--json")))
    assert record["target"] == minted["client_id"]
    assert record["details"] == {"from": "https://mcp.example.com/hooks",
                                 "to": "https://mcp.example.com/v2/hooks"}
