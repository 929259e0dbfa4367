"""The example MCP server: its bearer-token check against a real OpenID Connect provider,
and its tools against the served gateway."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.server.auth.middleware.auth_context import auth_context_var
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp_types import CallToolResult, ElicitRequestURLParams, ElicitResult, TextContent

from gateway.client import GatewayClient, Subject
from tests.client.conftest import OAUTH_TYPE, ServedGateway, User
from tests.integration.conftest import free_port
from tests.oidc.fixtures import OidcProvider

pytestmark = pytest.mark.slow

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import weather_server  # noqa: E402

KEY = "wx-live-7f3a9c2e5b1d4a6f8e0c"


def test_the_verifier_accepts_the_providers_tokens_and_nothing_else(
    oidc_provider: OidcProvider,
) -> None:
    token = oidc_provider.id_token("alice")
    verifier = weather_server.OidcJwtVerifier(oidc_provider.issuer, oidc_provider.client_id)
    checked = verifier.check(token)
    assert checked is not None
    assert checked.subject == "alice"
    assert checked.claims == {"iss": oidc_provider.issuer}
    head, body, signature = token.split(".")
    assert verifier.check(f"{head}.{body}.{signature[::-1]}") is None
    assert verifier.check("not-a-jwt") is None
    other = weather_server.OidcJwtVerifier(oidc_provider.issuer, "another-audience")
    assert other.check(token) is None


def test_the_example_tool_asks_the_signed_in_user_for_their_key(
    served: ServedGateway, user: User,
) -> None:
    registered = served.register()
    config = weather_server.Config(
        served.origin, registered.api_token, registered.webhook_secret,
        oidc_issuer="https://auth.example.com", oidc_audience="weather",
        gateway_ca_bundle=str(served.certfile))
    server, _ = weather_server.build_server(config)
    # What the bearer middleware puts in context for a token the verifier accepted;
    # the local login backend names the same person (gateway origin, user name).
    principal = AccessToken(token="t", client_id="weather", scopes=[], subject=user.username,
                            claims={"iss": served.origin})

    async def on_elicit(_context: Any, params: ElicitRequestURLParams) -> ElicitResult:
        user.enter_key_later(params.url, KEY, delay=1)
        return ElicitResult(action="accept")

    async def main() -> Any:
        auth_context_var.set(AuthenticatedUser(principal))
        async with Client(server, mode="2026-07-28", elicitation_callback=on_elicit) as client:
            return await client.call_tool("forecast", {"city": "Oslo"})

    result = anyio.run(main)
    [content] = result.content
    assert isinstance(content, TextContent)
    assert content.text.startswith("Tomorrow in Oslo")
    assert content.text.endswith("…8e0c)")


def call_example_tool(gateway_url: str, api_token: str, ca_bundle: str, username: str,
                      tool: str, arguments: dict[str, Any],
                      mode: str = "2026-07-28") -> CallToolResult:
    """One tool call of the example server, by the signed-in ``username``, through an MCP client."""
    config = weather_server.Config(
        gateway_url, api_token, "whsec_" + "w" * 43, oidc_issuer="https://auth.example.com",
        oidc_audience="weather", gateway_ca_bundle=ca_bundle)
    server, _ = weather_server.build_server(config)
    principal = AccessToken(token="t", client_id="weather", scopes=[], subject=username,
                            claims={"iss": gateway_url})

    async def never_asked(_context: Any, _params: ElicitRequestURLParams) -> ElicitResult:
        raise AssertionError("no link should reach the user when the gateway fails")

    async def main() -> CallToolResult:
        auth_context_var.set(AuthenticatedUser(principal))
        async with Client(server, mode=mode, elicitation_callback=never_asked) as client:
            return await client.call_tool(tool, arguments)

    return anyio.run(main)


# --- whoami_on_provider: an OAuth connection ------------------------------------------

ACCESS_TOKEN = "gho_" + "d" * 36


class Userinfo(BaseHTTPRequestHandler):
    """The provider's userinfo endpoint: knows one access token, until it is revoked."""

    accepted: str | None = ACCESS_TOKEN

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != f"Bearer {type(self).accepted}":
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.dumps({"login": "octocat", "id": 583231}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def userinfo_url() -> Iterator[str]:
    Userinfo.accepted = ACCESS_TOKEN
    server = ThreadingHTTPServer(("127.0.0.1", 0), Userinfo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/userinfo"
    finally:
        server.shutdown()
        server.server_close()


def example_config(served: ServedGateway, *, oauth_type: str | None = None,
                   oauth_userinfo_url: str | None = None) -> weather_server.Config:
    registered = served.register()
    return weather_server.Config(
        served.origin, registered.api_token, registered.webhook_secret,
        oidc_issuer="https://auth.example.com", oidc_audience="weather",
        gateway_ca_bundle=str(served.certfile), oauth_type=oauth_type,
        oauth_userinfo_url=oauth_userinfo_url)


def call_as(user: User, served: ServedGateway, config: weather_server.Config,
            tool: str) -> CallToolResult:
    """Call ``tool`` of the example as ``user``, signed in; any link they get is left unanswered."""
    server, _ = weather_server.build_server(config)
    principal = AccessToken(token="t", client_id="weather", scopes=[], subject=user.username,
                            claims={"iss": served.origin})

    async def main() -> CallToolResult:
        auth_context_var.set(AuthenticatedUser(principal))
        async with Client(server, mode="2026-07-28") as client:
            return await client.call_tool(tool, {})

    return anyio.run(main)


def text_of(result: CallToolResult) -> str:
    [content] = result.content
    assert isinstance(content, TextContent)
    return content.text


def test_the_oauth_tool_says_when_this_server_has_no_provider_configured(
    served: ServedGateway, user: User,
) -> None:
    result = call_as(user, served, example_config(served), "whoami_on_provider")
    assert result.is_error
    assert "no OAuth provider configured" in text_of(result)
    assert "WEATHER_OAUTH_TYPE" in text_of(result)


def test_the_oauth_tool_says_when_the_gateway_has_no_such_oauth_type(
    served: ServedGateway, user: User, userinfo_url: str,
) -> None:
    config = example_config(served, oauth_type="generic", oauth_userinfo_url=userinfo_url)
    result = call_as(user, served, config, "whoami_on_provider")
    assert result.is_error
    assert "The gateway has no OAuth connection type 'generic'" in text_of(result)
    assert f"this gateway knows {OAUTH_TYPE}" in text_of(result)


def test_the_oauth_tool_names_the_connected_account_until_the_provider_revokes_it(
    served: ServedGateway, user: User, userinfo_url: str,
) -> None:
    config = example_config(served, oauth_type=OAUTH_TYPE, oauth_userinfo_url=userinfo_url)
    gateway = GatewayClient(served.origin, config.gateway_api_token, verify=str(served.certfile))
    subject = Subject(served.origin, user.username)
    asked = gateway.request_oauth(subject, OAUTH_TYPE, "Connect your account")
    served.connect_account(asked.id, ACCESS_TOKEN, account="octocat")

    result = call_as(user, served, config, "whoami_on_provider")
    assert text_of(result) == "You are octocat at 127.0.0.1."

    Userinfo.accepted = None  # the user revoked the app at the provider
    gone = call_as(user, served, config, "whoami_on_provider")
    assert gone.is_error
    assert "call this tool again" in text_of(gone)
    assert gateway.find_credential(subject, OAUTH_TYPE) is None


@pytest.mark.parametrize(("environ", "complaint"), [
    ({"WEATHER_OAUTH_TYPE": "forge"}, "needs WEATHER_OAUTH_USERINFO_URL"),
    ({"WEATHER_OAUTH_TYPE": "forge", "WEATHER_OAUTH_USERINFO_URL": "http://forge.example/u"},
     "must be https://"),
])
def test_the_oauth_settings_are_checked_at_start(environ: dict[str, str], complaint: str) -> None:
    required = {"GATEWAY_URL": "https://gateway.test", "GATEWAY_API_TOKEN": "gw_x",
                "GATEWAY_WEBHOOK_SECRET": "whsec_x", "OIDC_ISSUER": "https://auth.example.com",
                "OIDC_AUDIENCE": "weather"}
    with pytest.raises(SystemExit, match=complaint):
        weather_server.Config.from_environ({**required, **environ})
    config = weather_server.Config.from_environ(
        {**required, "WEATHER_OAUTH_TYPE": "forge",
         "WEATHER_OAUTH_USERINFO_URL": "https://forge.example/api/user"})
    assert (config.oauth_type, config.oauth_userinfo_url) == (
        "forge", "https://forge.example/api/user")


def error_text(result: CallToolResult) -> str:
    assert result.is_error
    return text_of(result)


def test_a_gateway_without_payments_says_so_in_the_tool_error(
    served_without_payments: ServedGateway,
) -> None:
    served = served_without_payments
    registered = served.register()
    result = call_example_tool(served.origin, registered.api_token, str(served.certfile),
                               served.user(), "premium_forecast",
                               {"city": "Oslo", "order_id": "order-1"})
    # The gateway's own words alone: the problem's title, then its detail.
    assert error_text(result) == (
        "Payments are not configured: this gateway takes no payments: its operator has not "
        "set GATEWAY_STRIPE_SECRET_KEY")


def test_a_refused_api_token_says_so_in_the_tool_error(served: ServedGateway,
                                                        user: User) -> None:
    result = call_example_tool(served.origin, "gw_" + "x" * 43, str(served.certfile),
                               user.username, "forecast", {"city": "Oslo"})
    text = error_text(result)
    assert text == "Unauthenticated: the API token is not valid: unknown or revoked"
    assert "gw_xxxx" not in text


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_a_gateway_that_does_not_answer_is_named_in_the_tool_error(
    served: ServedGateway, user: User, mode: str,
) -> None:
    silent = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    result = call_example_tool(silent, "gw_token", str(served.certfile), user.username,
                               "forecast", {"city": "Oslo"}, mode=mode)
    assert error_text(result) == f"The gateway at {silent} did not answer: connection refused."
