"""The example MCP server: its bearer-token check against a real OpenID Connect provider,
and its tools against the served gateway."""

from __future__ import annotations

import base64
import hashlib
import secrets
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import anyio
import pytest
import requests
from mcp import Client
from mcp.server.auth.middleware.auth_context import auth_context_var
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp_types import ElicitRequestURLParams, ElicitResult, TextContent

from tests.client.conftest import ServedGateway, User
from tests.oidc.fixtures import OidcProvider, new_session

pytestmark = pytest.mark.slow

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import weather_server  # noqa: E402

KEY = "wx-live-7f3a9c2e5b1d4a6f8e0c"


def id_token_of(provider: OidcProvider, username: str) -> str:
    """Sign in as ``username`` (authorization code flow) and return the ID token."""
    metadata = provider.metadata()
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
    query = urlencode({"client_id": provider.client_id, "response_type": "code",
                       "scope": "openid", "redirect_uri": provider.redirect_uri,
                       "state": secrets.token_urlsafe(8), "nonce": secrets.token_urlsafe(8),
                       "code_challenge": challenge.decode().rstrip("="),
                       "code_challenge_method": "S256"})
    back = provider.login(new_session(), f"{metadata['authorization_endpoint']}?{query}", username)
    code = parse_qs(urlsplit(back).query)["code"][0]
    answer = requests.post(metadata["token_endpoint"], timeout=10, data={
        "grant_type": "authorization_code", "code": code, "redirect_uri": provider.redirect_uri,
        "client_id": provider.client_id, "client_secret": provider.client_secret,
        "code_verifier": verifier})
    assert answer.ok, answer.text
    token: str = answer.json()["id_token"]
    return token


def test_the_verifier_accepts_the_providers_tokens_and_nothing_else(
    oidc_provider: OidcProvider,
) -> None:
    token = id_token_of(oidc_provider, "alice")
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
