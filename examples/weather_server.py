"""An MCP server that uses the gateway: a weather tool needing the user's API key, and a paid one.

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

import anyio.to_thread
import jwt
import requests
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import InputRequiredResult

from gateway.client import GatewayClient
from gateway.client.mcp import CompletionNotifier, GatewayElicitations, subject_of

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

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> Config:
        env = dict(os.environ if environ is None else environ)
        missing = [name for name in ("GATEWAY_URL", "GATEWAY_API_TOKEN", "GATEWAY_WEBHOOK_SECRET",
                                     "OIDC_ISSUER", "OIDC_AUDIENCE") if not env.get(name)]
        if missing:
            raise SystemExit(f"set {', '.join(missing)} (see docs/sdk.md)")
        return cls(env["GATEWAY_URL"], env["GATEWAY_API_TOKEN"], env["GATEWAY_WEBHOOK_SECRET"],
                   env["OIDC_ISSUER"], env["OIDC_AUDIENCE"],
                   public_url=env.get("MCP_PUBLIC_URL", cls.public_url),
                   gateway_ca_bundle=env.get("GATEWAY_CA_BUNDLE") or None,
                   credential_type=env.get("WEATHER_CREDENTIAL_TYPE", cls.credential_type))


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
    async def premium_forecast(city: str, order_id: str, ctx: Context) -> str | InputRequiredResult:
        """A 14-day forecast for 1.99 USD. ``order_id``: a new id for each purchase."""
        paid = await elicitations.payment(
            ctx, subject_of(), {"amount": 199, "currency": "usd",
                                "description": f"14-day forecast for {city}"},
            "Pay 1.99 USD for a 14-day forecast.", order_id=order_id)
        if isinstance(paid, InputRequiredResult):
            return paid
        return f"14 days in {city}: mostly sunny (order {order_id}, payment {paid.id})"

    server.custom_route("/webhooks/gateway", methods=["POST"])(notifier.endpoint)
    return server, elicitations


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
