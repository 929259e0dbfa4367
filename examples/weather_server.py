"""An MCP server using the gateway: tools that need an API key, a payment or a connected account.

Runs on the official ``mcp`` SDK over streamable HTTP. Its users sign in to
their MCP client with the same OpenID Connect provider the gateway trusts;
the client sends the access token (a JWT) as a bearer token, which this
server checks against the provider's published keys. The subject it hands
the gateway is the token's ``(iss, sub)``, so only that same person, signed
in to the gateway, can answer the link.

    pip install 'gateway[mcp]' uvicorn
    export GATEWAY_URL=https://localhost:8443 GATEWAY_API_TOKEN=gw_... \\
           GATEWAY_WEBHOOK_SECRET=whsec_... GATEWAY_CA_BUNDLE=instance/tls/localhost-cert.pem \\
           OIDC_ISSUER=https://auth.example.com OIDC_AUDIENCE=weather-mcp
    python examples/weather_server.py --port 8000

For the OAuth tool, ``whoami_on_provider``, also set
``WEATHER_OAUTH_TYPE`` (an OAuth credential type of the gateway's catalog)
and ``WEATHER_OAUTH_USERINFO_URL`` (the provider's userinfo endpoint, which
the tool calls with the user's access token).

When the gateway refuses a call (payments not configured, a revoked API
token) or does not answer, the tool call ends as a tool error in the
gateway's own words, which the MCP client shows its user.

Endpoints: ``/mcp`` (MCP, bearer token required) and ``/webhooks/gateway``
(the gateway's signed webhooks; register it with ``gateway clients create
--webhook-url``). "The example server" in docs/sdk.md runs it beside
``gateway demo``, with weather_client.py as the user's MCP client.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anyio.to_thread
import jwt
import requests
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import InputRequiredResult

from gateway.client import GatewayClient, InvalidRequest, ProviderUnavailable, RevealedCredential
from gateway.client.mcp import (
    CompletionNotifier,
    GatewayCallFailed,
    GatewayElicitations,
    in_own_words,
    subject_of,
)

# Asymmetric algorithms only: a token signed with "none" or an HMAC is never accepted.
ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA"]


@dataclass(frozen=True)
class Config:
    gateway_url: str
    gateway_api_token: str
    gateway_webhook_secret: str
    oidc_issuer: str
    oidc_audience: str
    public_url: str = "http://127.0.0.1:8000"
    gateway_ca_bundle: str | None = None
    credential_type: str = "generic"
    # The OAuth tool's provider: unset, the tool says it is not configured.
    oauth_type: str | None = None
    oauth_userinfo_url: str | None = None

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> Config:
        env = dict(os.environ if environ is None else environ)
        missing = [name for name in ("GATEWAY_URL", "GATEWAY_API_TOKEN", "GATEWAY_WEBHOOK_SECRET",
                                     "OIDC_ISSUER", "OIDC_AUDIENCE") if not env.get(name)]
        if missing:
            raise SystemExit(f"set {', '.join(missing)} (see docs/sdk.md)")
        oauth_type = env.get("WEATHER_OAUTH_TYPE") or None
        userinfo_url = env.get("WEATHER_OAUTH_USERINFO_URL") or None
        if oauth_type and not userinfo_url:
            raise SystemExit("WEATHER_OAUTH_TYPE needs WEATHER_OAUTH_USERINFO_URL, the "
                             "provider's userinfo endpoint")
        if userinfo_url and not _safe_for_tokens(userinfo_url):
            raise SystemExit("WEATHER_OAUTH_USERINFO_URL must be https:// (plain http only "
                             "to 127.0.0.1 or localhost): it is sent access tokens")
        return cls(env["GATEWAY_URL"], env["GATEWAY_API_TOKEN"], env["GATEWAY_WEBHOOK_SECRET"],
                   env["OIDC_ISSUER"], env["OIDC_AUDIENCE"],
                   public_url=env.get("MCP_PUBLIC_URL", cls.public_url),
                   gateway_ca_bundle=env.get("GATEWAY_CA_BUNDLE") or None,
                   credential_type=env.get("WEATHER_CREDENTIAL_TYPE", cls.credential_type),
                   oauth_type=oauth_type, oauth_userinfo_url=userinfo_url)


def _safe_for_tokens(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme == "https" or (
        parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost"))


class OidcJwtVerifier:
    """Checks bearer JWTs: signature by the provider's JWKS, issuer, audience, expiry."""

    def __init__(self, issuer: str, audience: str) -> None:
        self.issuer = issuer.rstrip("/")
        self.audience = audience
        self._keys: jwt.PyJWKClient | None = None

    def _jwks(self) -> jwt.PyJWKClient:
        if self._keys is None:
            discovery = requests.get(f"{self.issuer}/.well-known/openid-configuration", timeout=10)
            discovery.raise_for_status()
            self._keys = jwt.PyJWKClient(discovery.json()["jwks_uri"], cache_keys=True)
        return self._keys

    def check(self, token: str) -> AccessToken | None:
        """The token's principal, or None for any token that does not check out."""
        try:
            key = self._jwks().get_signing_key_from_jwt(token)
            claims: dict[str, Any] = jwt.decode(
                token, key.key, algorithms=ALGORITHMS, audience=self.audience,
                issuer=self.issuer, options={"require": ["iss", "sub", "exp"]})
        except (jwt.PyJWTError, requests.RequestException, KeyError):
            return None
        return AccessToken(token=token, client_id=str(claims.get("azp") or self.audience),
                           scopes=str(claims.get("scope", "")).split(),
                           expires_at=int(claims["exp"]), subject=str(claims["sub"]),
                           claims={"iss": claims["iss"]})

    async def verify_token(self, token: str) -> AccessToken | None:
        # Key fetches block; keep them off the event loop.
        return await anyio.to_thread.run_sync(self.check, token)


def build_server(config: Config) -> tuple[MCPServer, GatewayElicitations]:
    gateway = GatewayClient(config.gateway_url, config.gateway_api_token,
                            verify=config.gateway_ca_bundle or True)
    notifier = CompletionNotifier(config.gateway_webhook_secret)
    elicitations = GatewayElicitations(gateway, notifier=notifier)
    server = MCPServer(
        "weather", instructions="Weather forecasts; the first use asks for your API key.",
        token_verifier=OidcJwtVerifier(config.oidc_issuer, config.oidc_audience),
        # The verifier checks the audience itself, so the SDK need not compare resources.
        auth=AuthSettings(issuer_url=config.oidc_issuer, resource_server_url=config.public_url,
                          validate_token_resource=False))

    @server.tool()
    @in_own_words
    async def forecast(city: str, ctx: Context) -> str | InputRequiredResult:
        """Tomorrow's forecast for a city, from the user's own weather-service account."""
        key = await elicitations.api_key(
            ctx, subject_of(), config.credential_type,
            "Connect your weather service API key to get forecasts.")
        if isinstance(key, InputRequiredResult):
            return key
        # A real server would call the weather service with key.secret here.
        return f"Tomorrow in {city}: sunny, 21 °C (fetched with your key …{key.secret[-4:]})"

    @server.tool()
    @in_own_words
    async def premium_forecast(city: str, order_id: str, ctx: Context) -> str | InputRequiredResult:
        """A 14-day forecast for 1.99 USD. ``order_id``: a new id for each purchase."""
        paid = await elicitations.payment(
            ctx, subject_of(), {"amount": 199, "currency": "usd",
                                "description": f"14-day forecast for {city}"},
            "Pay 1.99 USD for a 14-day forecast.", order_id=order_id)
        if isinstance(paid, InputRequiredResult):
            return paid
        return f"14 days in {city}: mostly sunny (order {order_id}, payment {paid.id})"

    @server.tool()
    @in_own_words
    async def whoami_on_provider(ctx: Context) -> str | InputRequiredResult:
        """The account you connected at the OAuth provider; the first use asks you to connect."""
        if config.oauth_type is None or config.oauth_userinfo_url is None:
            raise ToolError("This server has no OAuth provider configured: its operator sets "
                            "WEATHER_OAUTH_TYPE and WEATHER_OAUTH_USERINFO_URL.")
        try:
            token = await elicitations.oauth_token(
                ctx, subject_of(), config.oauth_type,
                "Connect your account so this server can see who you are there.")
        except GatewayCallFailed as failed:
            # The helper's error already has the gateway's words; two cases this
            # server can put better for its own users.
            refused = failed.error
            if isinstance(refused, InvalidRequest) and \
                    refused.problem.get("field") == "credential_type":
                raise ToolError(f"The gateway has no OAuth connection type "
                                f"{config.oauth_type!r} configured ({refused.detail}). Its "
                                "operator adds one (kind = \"oauth\") to its credential types "
                                "file.") from None
            if isinstance(refused, ProviderUnavailable):
                raise ToolError("The provider of your account is not answering; try again in "
                                f"{refused.retry_after or 30:.0f} seconds.") from None
            raise
        if isinstance(token, InputRequiredResult):
            return token
        name = await anyio.to_thread.run_sync(
            account_at, gateway, config.oauth_userinfo_url, token)
        return f"You are {name} at {urlsplit(config.oauth_userinfo_url).hostname}."

    server.custom_route("/webhooks/gateway", methods=["POST"])(notifier.endpoint)
    return server, elicitations


# The userinfo claims that name an account, most specific first.
ACCOUNT_CLAIMS = ("login", "preferred_username", "email", "name", "sub")


def account_at(gateway: GatewayClient, userinfo_url: str, token: RevealedCredential) -> str:
    """The account name the provider's userinfo endpoint gives for this access token."""
    try:
        answer = requests.get(userinfo_url, timeout=10, allow_redirects=False, headers={
            # Bearer whatever the token response spelled: schemes are case-insensitive,
            # and this example supports no other kind of token.
            "Authorization": f"Bearer {token.secret}", "Accept": "application/json"})
    except requests.RequestException:
        raise ToolError("The provider's userinfo endpoint did not answer; try again later.") \
            from None
    if answer.status_code == 401:
        # Revoked at the provider: forget it, so the next call asks the user to connect again.
        gateway.revoke_credential(token.id)
        raise ToolError("The provider no longer accepts your connection; call this tool again "
                        "to connect your account anew.")
    if answer.status_code != 200:
        raise ToolError(f"The provider's userinfo endpoint answered HTTP {answer.status_code}.")
    try:
        claims = answer.json()
    except ValueError:
        claims = None
    if isinstance(claims, dict):
        for claim in ACCOUNT_CLAIMS:
            if isinstance(claims.get(claim), str | int) and str(claims[claim]).strip():
                return str(claims[claim])
    return token.account or "an account the provider does not name"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    arguments = parser.parse_args()
    server, _ = build_server(Config.from_environ())
    import uvicorn  # only needed to serve, not to import this module in tests

    uvicorn.run(server.streamable_http_app(host=arguments.host), host=arguments.host,
                port=arguments.port)


if __name__ == "__main__":
    main()
