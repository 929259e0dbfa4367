"""A command-line MCP client for the example weather server: sign in, call a tool, follow the link.

It signs you in at the OpenID Connect provider in your browser (authorization
code with PKCE; the code comes back to a one-shot listener on 127.0.0.1),
sends the ID token as the bearer token, and calls a tool with the official
``mcp`` SDK's client. When the tool needs your API key or a payment, it
prints the gateway's link (and opens it); finish there and the call goes on.

    export OIDC_ISSUER=http://127.0.0.1:9000 OIDC_CLIENT_ID=weather-cli OIDC_CLIENT_SECRET=...
    python examples/weather_client.py forecast city=Oslo
    python examples/weather_client.py --mode legacy premium_forecast city=Oslo order_id=o-1

The provider must know ``http://127.0.0.1:<--redirect-port>/callback`` as a
redirect URI of that client, and its ID tokens must carry the audience the
server expects (its ``OIDC_AUDIENCE``: the client id).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import secrets
import sys
import webbrowser
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import anyio
import httpx2
import jwt
import requests
from mcp import Client
from mcp.client.session import ClientRequestContext, IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError, UrlElicitationRequiredError
from mcp_types import (
    URL_ELICITATION_REQUIRED,
    CallToolResult,
    ElicitCompleteNotification,
    ElicitRequestParams,
    ElicitRequestURLParams,
    ElicitResult,
    TextContent,
)

# How long a person may take to sign in, or to finish on the gateway's page.
USER_TIMEOUT = 600


# --- signing in ------------------------------------------------------------------


class _Callback(BaseHTTPRequestHandler):
    """Receives the provider's redirect with the code, once."""

    query: dict[str, list[str]] | None = None

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        if parts.path != "/callback":
            self.send_error(404)
            return
        type(self).query = parse_qs(parts.query)
        body = b"Signed in. You can close this tab and go back to the terminal.\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def sign_in(issuer: str, client_id: str, client_secret: str, port: int,
            show: Callable[[str, str], None]) -> str:
    """The ID token of whoever signs in, in the browser, at ``issuer``."""
    metadata = requests.get(f"{issuer.rstrip('/')}/.well-known/openid-configuration",
                            timeout=10).json()
    redirect_uri = f"http://127.0.0.1:{port}/callback"
    verifier, state, nonce = (secrets.token_urlsafe(48), secrets.token_urlsafe(16),
                              secrets.token_urlsafe(16))
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
    query = urlencode({"response_type": "code", "client_id": client_id, "scope": "openid",
                       "redirect_uri": redirect_uri, "state": state, "nonce": nonce,
                       "code_challenge": challenge.decode().rstrip("="),
                       "code_challenge_method": "S256"})
    with HTTPServer(("127.0.0.1", port), _Callback) as listener:
        listener.timeout = USER_TIMEOUT
        show("sign in", f"{metadata['authorization_endpoint']}?{query}")
        _Callback.query = None
        while _Callback.query is None:
            listener.handle_request()
    answer = {name: values[0] for name, values in _Callback.query.items()}
    if answer.get("state") != state:
        raise SystemExit("sign-in failed: the answer is not for this request (state)")
    if "code" not in answer:
        raise SystemExit(f"sign-in failed: {answer.get('error')} {answer.get('error_description')}")
    tokens = requests.post(metadata["token_endpoint"], timeout=10, auth=(client_id, client_secret),
                           data={"grant_type": "authorization_code", "code": answer["code"],
                                 "redirect_uri": redirect_uri, "code_verifier": verifier})
    tokens.raise_for_status()
    id_token: str = tokens.json()["id_token"]
    # Straight from the token endpoint, so only the nonce is ours to check; the MCP
    # server checks the signature, issuer, audience and expiry on every request.
    if jwt.decode(id_token, options={"verify_signature": False}).get("nonce") != nonce:
        raise SystemExit("sign-in failed: the ID token is not for this request (nonce)")
    return id_token


# --- calling the tool --------------------------------------------------------------


class WeatherCall:
    """One tool call; URL elicitations are shown to the user, and the call goes on."""

    def __init__(self, url: str, token: str, mode: str, show: Callable[[str, str], None]) -> None:
        self.url, self.token, self.mode, self.show = url, token, mode, show
        self._done_send, self._done_receive = anyio.create_memory_object_stream[str](16)

    async def call(self, tool: str, arguments: dict[str, Any]) -> CallToolResult:
        # The server may hold a response open while it waits for the user to finish.
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {self.token}"},
                                  timeout=httpx2.Timeout(30, read=USER_TIMEOUT))
        async with self._done_send, self._done_receive, http, Client(
            streamable_http_client(self.url, http_client=http), mode=self.mode,
            elicitation_callback=self._elicit, message_handler=self._notified,
        ) as client:
            if self.mode != "legacy":
                # 2026-07-28: the SDK hands inputRequests to _elicit and retries by itself.
                return await client.call_tool(tool, arguments)
            try:
                return await client.call_tool(tool, arguments)
            except MCPError as error:
                if error.code != URL_ELICITATION_REQUIRED:
                    raise
                required = UrlElicitationRequiredError.from_error(error.error)
            # 2025-11-25: show the links, retry once the server says they are finished.
            waiting = set()
            for params in required.elicitations:
                self._show_link(params)
                waiting.add(params.elicitation_id)
            with anyio.fail_after(USER_TIMEOUT):
                while waiting:
                    waiting.discard(await self._done_receive.receive())
            return await client.call_tool(tool, arguments)

    def _show_link(self, params: ElicitRequestURLParams) -> None:
        print(params.message, flush=True)
        self.show("open", params.url)

    async def _elicit(self, _context: ClientRequestContext,
                      params: ElicitRequestParams) -> ElicitResult:
        if not isinstance(params, ElicitRequestURLParams):
            return ElicitResult(action="decline")  # this client shows links only, no forms
        self._show_link(params)
        return ElicitResult(action="accept")

    async def _notified(self, message: IncomingMessage) -> None:
        if isinstance(message, ElicitCompleteNotification):
            self._done_send.send_nowait(message.params.elicitation_id)


# --- the command -------------------------------------------------------------------


def _argument(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"expected name=value, got {text!r}")
    return name, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tool", help="forecast or premium_forecast")
    parser.add_argument("arguments", nargs="*", type=_argument, help="name=value ...")
    parser.add_argument("--mcp-url", default="http://127.0.0.1:8000/mcp")
    parser.add_argument("--mode", default="2026-07-28", choices=["legacy", "2026-07-28"],
                        help="legacy: protocol 2025-11-25 (error -32042, then a notification)")
    parser.add_argument("--redirect-port", type=int, default=8976,
                        help="loopback port of the sign-in redirect (default 8976)")
    parser.add_argument("--no-browser", action="store_true", help="print links, open nothing")
    options = parser.parse_args()
    missing = [name for name in ("OIDC_ISSUER", "OIDC_CLIENT_ID", "OIDC_CLIENT_SECRET")
               if not os.environ.get(name)]
    if missing:
        raise SystemExit(f"set {', '.join(missing)} (see docs/sdk.md)")

    def show(what: str, url: str) -> None:
        print(f"{what}: {url}", flush=True)
        if not options.no_browser:
            webbrowser.open(url)

    token = sign_in(os.environ["OIDC_ISSUER"], os.environ["OIDC_CLIENT_ID"],
                    os.environ["OIDC_CLIENT_SECRET"], options.redirect_port, show)
    call = WeatherCall(options.mcp_url, token, options.mode, show)
    result = anyio.run(call.call, options.tool, dict(options.arguments))
    for content in result.content:
        print(content.text if isinstance(content, TextContent) else content, flush=True)
    sys.exit(1 if result.is_error else 0)


if __name__ == "__main__":
    main()
