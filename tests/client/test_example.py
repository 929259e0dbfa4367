"""The example MCP server: its bearer-token check against a real OpenID Connect provider,
and its tools against the served gateway."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.server.auth.middleware.auth_context import auth_context_var
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp_types import ElicitRequestURLParams, ElicitResult, TextContent

from tests.client.conftest import ServedGateway, User
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
                      tool: str, arguments: dict[str, Any], mode: str = "2026-07-28") -> Any:
    """One tool call of the example server, by the signed-in ``username``, through an MCP client."""
    config = weather_server.Config(
        gateway_url, api_token, "whsec_" + "w" * 43, oidc_issuer="https://auth.example.com",
        oidc_audience="weather", gateway_ca_bundle=ca_bundle)
    server, _ = weather_server.build_server(config)
    principal = AccessToken(token="t", client_id="weather", scopes=[], subject=username,
                            claims={"iss": gateway_url})

    async def never_asked(_context: Any, _params: ElicitRequestURLParams) -> ElicitResult:
        raise AssertionError("no link should reach the user when the gateway fails")

    async def main() -> Any:
        auth_context_var.set(AuthenticatedUser(principal))
        async with Client(server, mode=mode, elicitation_callback=never_asked) as client:
            return await client.call_tool(tool, arguments)

    return anyio.run(main)


def error_text(result: Any) -> str:
    assert result.is_error
    [content] = result.content
    assert isinstance(content, TextContent)
    text: str = content.text
    return text


def test_a_gateway_without_payments_says_so_in_the_tool_error(
    served_without_payments: ServedGateway,
) -> None:
    served = served_without_payments
    registered = served.register()
    result = call_example_tool(served.origin, registered.api_token, str(served.certfile),
                               served.user(), "premium_forecast",
                               {"city": "Oslo", "order_id": "order-1"})
    # The gateway's own words: the problem's title, then its detail.
    assert error_text(result).endswith(
        "Payments are not configured: this gateway takes no payments: its operator has not "
        "set GATEWAY_STRIPE_SECRET_KEY")


def test_a_refused_api_token_says_so_in_the_tool_error(served: ServedGateway,
                                                        user: User) -> None:
    result = call_example_tool(served.origin, "gw_" + "x" * 43, str(served.certfile),
                               user.username, "forecast", {"city": "Oslo"})
    text = error_text(result)
    assert text.endswith("Unauthenticated: the API token is not valid: unknown or revoked")
    assert "gw_xxxx" not in text


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_a_gateway_that_does_not_answer_is_named_in_the_tool_error(
    served: ServedGateway, user: User, mode: str,
) -> None:
    silent = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    result = call_example_tool(silent, "gw_token", str(served.certfile), user.username,
                               "forecast", {"city": "Oslo"}, mode=mode)
    assert error_text(result).endswith(
        f"The gateway at {silent} did not answer: connection refused.")
