"""An identity provider on an internal certificate authority, trusted through
``GATEWAY_OUTBOUND_CA_BUNDLE``: what an operator sees from the command line."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Result
from tests.private_ca import PrivateAuthority


@pytest.fixture
def authority() -> PrivateAuthority:
    return PrivateAuthority()


@pytest.fixture
def internal_issuer(authority: PrivateAuthority, tmp_path: Path) -> Iterator[str]:
    """An OpenID Connect provider's discovery document on https://localhost, internal CA."""
    state: dict[str, str] = {}

    class Discovery(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            issuer = state["issuer"]
            body = json.dumps({
                "issuer": issuer, "authorization_endpoint": f"{issuer}/authorize",
                "token_endpoint": f"{issuer}/token", "jwks_uri": f"{issuer}/jwks",
            }).encode()
            self.send_response(200 if self.path == "/.well-known/openid-configuration" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Discovery)
    server.socket = authority.server_context("localhost", tmp_path).wrap_socket(
        server.socket, server_side=True)
    state["issuer"] = f"https://localhost:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield state["issuer"]
    server.shutdown()
    server.server_close()
    thread.join()


def oidc_environ(cli_environ: dict[str, str], issuer: str, **extra: str) -> dict[str, str]:
    return {**cli_environ, "GATEWAY_LOGIN_BACKEND": "oidc", "GATEWAY_OIDC_ISSUER": issuer,
            "GATEWAY_OIDC_CLIENT_ID": "gateway", "GATEWAY_OIDC_CLIENT_SECRET": "not-used",
            "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": issuer.removeprefix("https://"),
            **extra}


def issuer_problems(result: Result) -> list[str]:
    report = json.loads(result.stdout)
    return [problem["problem"] for problem in report["configuration"]
            if problem["setting"] == "GATEWAY_OIDC_ISSUER"]


def test_status_reaches_an_issuer_on_an_internal_ca_only_with_the_bundle(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str], internal_issuer: str,
    authority: PrivateAuthority, tmp_path: Path,
) -> None:
    untrusted = invoke_gateway("status", "--json", env=oidc_environ(cli_environ, internal_issuer))
    [problem] = issuer_problems(untrusted)
    assert "cannot be reached" in problem
    assert "SSLError" in problem
    bundle = authority.write(tmp_path / "internal-ca.pem")
    trusted = invoke_gateway("status", "--json", env=oidc_environ(
        cli_environ, internal_issuer, GATEWAY_OUTBOUND_CA_BUNDLE=str(bundle)))
    assert issuer_problems(trusted) == []


def test_a_missing_bundle_stops_every_command_with_one_line(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str], tmp_path: Path,
) -> None:
    missing = tmp_path / "absent.pem"
    result = invoke_gateway("status", env={**cli_environ,
                                           "GATEWAY_OUTBOUND_CA_BUNDLE": str(missing)})
    assert result.code == 1
    assert result.stderr == (f"Error: GATEWAY_OUTBOUND_CA_BUNDLE: cannot read {missing}: "
                             "No such file or directory\n")
