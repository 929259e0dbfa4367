"""The ``mcp`` helpers, driven by the ``mcp`` SDK's own client on both protocol versions.

The MCP server runs in-process (the SDK's in-memory transport); its tools
call the served gateway over real HTTPS. A "user" answers the links from
another thread, the way a person in a browser would, sometimes only after
the client has already retried.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import (
    URL_ELICITATION_REQUIRED,
    CallToolResult,
    ElicitCompleteNotification,
    ElicitRequestURLParams,
    ElicitResult,
    InputRequiredResult,
    TextContent,
)

from gateway.client import GatewayClient, RevealedCredential, Subject
from gateway.client.mcp import CompletionNotifier, GatewayElicitations
from tests.client.conftest import OAUTH_TYPE, ServedGateway, User

pytestmark = pytest.mark.slow

KEY = "wx-live-7f3a9c2e5b1d4a6f8e0c"
LEGACY, MODERN = "legacy", "2026-07-28"
PAYMENT = {"amount": 500, "currency": "eur", "description": "Premium forecast"}
ACCESS_TOKEN = "gho_" + "c" * 32 + "5e7d"


@dataclass
class Setup:
    served: ServedGateway
    user: User
    gateway: GatewayClient
    helpers: GatewayElicitations
    notifier: CompletionNotifier
    webhook_secret: str
    server: MCPServer
    tool_runs: list[str] = field(default_factory=list)

    @property
    def subject(self) -> Subject:
        return Subject(self.served.origin, self.user.username)


def make_setup(served: ServedGateway, user: User, *, retry_wait: float = 15,
               client_class: type[GatewayClient] = GatewayClient) -> Setup:
    registered = served.register()
    gateway = client_class(served.origin, registered.api_token, verify=str(served.certfile))
    notifier = CompletionNotifier(registered.webhook_secret)
    helpers = GatewayElicitations(gateway, retry_wait=retry_wait, notifier=notifier)
    server = MCPServer("weather")
    setup = Setup(served, user, gateway, helpers, notifier, registered.webhook_secret, server)

    @server.tool()
    async def forecast(city: str, ctx: Context) -> str | InputRequiredResult:
        """Tomorrow's weather; needs the user's weather-service key."""
        setup.tool_runs.append(ctx.protocol_version or "")
        key = await helpers.api_key(ctx, setup.subject, "generic",
                                    "Connect your weather service key")
        if isinstance(key, InputRequiredResult):
            return key
        return f"sunny in {city} (key …{key.secret[-4:]})"

    @server.tool()
    async def premium(order: str, ctx: Context) -> str | InputRequiredResult:
        """A paid forecast."""
        paid = await helpers.payment(ctx, setup.subject, PAYMENT, "Pay for the premium forecast",
                                     order_id=order)
        if isinstance(paid, InputRequiredResult):
            return paid
        return f"paid {paid.id}"

    @server.tool()
    async def repos(ctx: Context) -> str | InputRequiredResult:
        """The user's repositories; needs their Forge account connected."""
        setup.tool_runs.append(ctx.protocol_version or "")
        token = await helpers.oauth_token(ctx, setup.subject, OAUTH_TYPE,
                                          "Connect your Forge account", scopes=["read:user"])
        if isinstance(token, InputRequiredResult):
            return token
        return f"repos of {token.account} (token …{token.secret[-4:]})"

    return setup


@pytest.fixture
def setup(served: ServedGateway, user: User) -> Setup:
    return make_setup(served, user)


Handler = Callable[[Any, ElicitRequestURLParams], Awaitable[ElicitResult]]


def run(setup: Setup, mode: str, body: Callable[[Client], Awaitable[Any]], *,
        on_elicit: Handler | None = None, messages: list[Any] | None = None) -> Any:
    """Connect the SDK's client in ``mode`` and run ``body`` with it."""

    async def accept(_context: Any, _params: Any) -> ElicitResult:
        return ElicitResult(action="accept")

    async def collect(message: Any) -> None:
        if messages is not None:
            messages.append(message)

    async def main() -> Any:
        async with Client(setup.server, mode=mode, elicitation_callback=on_elicit or accept,
                          message_handler=collect) as client:
            return await body(client)

    return anyio.run(main)


def text_of(result: CallToolResult) -> str:
    [content] = result.content
    assert isinstance(content, TextContent)
    return content.text


def sign(secret: str, event: dict[str, Any]) -> tuple[dict[str, str], bytes]:
    """A webhook delivery as the gateway signs it (Standard Webhooks)."""
    body = json.dumps(event).encode()
    message_id, stamp = f"msg_{secrets.token_hex(8)}", str(int(time.time()))
    key = base64.b64decode(secret.removeprefix("whsec_"))
    digest = hmac.new(key, f"{message_id}.{stamp}.".encode() + body, hashlib.sha256).digest()
    return ({"webhook-id": message_id, "webhook-timestamp": stamp,
             "webhook-signature": "v1," + base64.b64encode(digest).decode()}, body)


# --- 2026-07-28: InputRequiredResult and requestState --------------------------------


def test_modern_a_retry_before_the_user_finishes_waits_and_succeeds(setup: Setup) -> None:
    shown: list[ElicitRequestURLParams] = []

    async def on_elicit(_context: Any, params: ElicitRequestURLParams) -> ElicitResult:
        shown.append(params)
        # The user starts typing; the client retries at once, long before they submit.
        setup.user.enter_key_later(params.url, KEY, delay=1.5)
        return ElicitResult(action="accept")

    result = run(setup, MODERN, lambda c: c.call_tool("forecast", {"city": "Oslo"}),
                 on_elicit=on_elicit)
    assert not result.is_error
    assert text_of(result) == "sunny in Oslo (key …8e0c)"
    [params] = shown
    assert params.mode == "url"
    assert params.elicitation_id is None  # 2026-07-28 has no elicitationId
    assert params.url.startswith(setup.served.origin + "/e/el_")
    assert params.message == "Connect your weather service key"
    assert setup.tool_runs == [MODERN, MODERN]  # asked, then the retry that waited

    # The key is in the vault now: the next call needs no elicitation at all.
    again = run(setup, MODERN, lambda c: c.call_tool("forecast", {"city": "Bergen"}),
                on_elicit=lambda *_: pytest.fail("asked again"))  # type: ignore[arg-type,return-value]
    assert text_of(again) == "sunny in Bergen (key …8e0c)"
    assert len(setup.gateway.list_elicitations(subject=setup.subject)) == 1


def test_modern_a_user_slower_than_the_wait_gets_state_only_rounds(
    served: ServedGateway, user: User,
) -> None:
    setup = make_setup(served, user, retry_wait=1)
    shown: list[str] = []

    async def on_elicit(_context: Any, params: ElicitRequestURLParams) -> ElicitResult:
        shown.append(params.url)
        setup.user.enter_key_later(params.url, KEY, delay=3)
        return ElicitResult(action="accept")

    result = run(setup, MODERN, lambda c: c.call_tool("forecast", {"city": "Oslo"}),
                 on_elicit=on_elicit)
    assert text_of(result) == "sunny in Oslo (key …8e0c)"
    assert len(shown) == 1  # the user was asked once, however many rounds it took
    assert len(setup.tool_runs) >= 3


def test_modern_a_refused_link_is_cancelled_and_the_tool_says_so(setup: Setup) -> None:
    async def on_elicit(_context: Any, _params: ElicitRequestURLParams) -> ElicitResult:
        return ElicitResult(action="decline")

    result = run(setup, MODERN, lambda c: c.call_tool("forecast", {"city": "Oslo"}),
                 on_elicit=on_elicit)
    assert result.is_error
    assert "cancelled" in text_of(result)
    [asked] = setup.gateway.list_elicitations(subject=setup.subject)
    assert asked.status == "cancelled"


def test_modern_a_declined_key_ends_the_call_with_an_error(setup: Setup) -> None:
    async def on_elicit(_context: Any, params: ElicitRequestURLParams) -> ElicitResult:
        await anyio.to_thread.run_sync(setup.user.log_in)
        await anyio.to_thread.run_sync(setup.user.decline, params.url)
        return ElicitResult(action="accept")

    result = run(setup, MODERN, lambda c: c.call_tool("forecast", {"city": "Oslo"}),
                 on_elicit=on_elicit)
    assert result.is_error
    assert "declined" in text_of(result)


def test_modern_the_request_state_is_sealed_and_cannot_be_forged(setup: Setup) -> None:
    async def body(client: Client) -> Any:
        first = await client.session.call_tool("forecast", {"city": "Oslo"},
                                               allow_input_required=True)
        assert isinstance(first, InputRequiredResult)
        assert first.request_state is not None
        [elicitation_id] = list(first.input_requests or {})
        # Sealed by the SDK: the gateway's id is not readable by the client.
        assert elicitation_id not in first.request_state
        forged = json.dumps({"gateway": {"api_key:generic": elicitation_id}})
        with pytest.raises(MCPError) as refused:
            await client.session.call_tool("forecast", {"city": "Oslo"}, request_state=forged,
                                           allow_input_required=True)
        return refused.value

    error = run(setup, MODERN, body)
    assert "requestState" in error.message


def test_modern_payment_asks_once_per_order(setup: Setup) -> None:
    async def body(client: Client) -> list[str]:
        ids = []
        for _ in range(2):
            first = await client.session.call_tool("premium", {"order": "o-1"},
                                                   allow_input_required=True)
            assert isinstance(first, InputRequiredResult)
            ids.extend(first.input_requests or {})
        return ids

    ids = run(setup, MODERN, body)
    assert ids[0] == ids[1]
    [asked] = setup.gateway.list_elicitations(subject=setup.subject)
    assert (asked.id, asked.kind, asked.payment) == (ids[0], "payment", {**PAYMENT,
                                                                          "mode": "payment",
                                                                          "customer_email": None})
    setup.gateway.cancel_elicitation(asked.id)
    ended = run(setup, MODERN, lambda c: c.call_tool("premium", {"order": "o-1"}))
    assert ended.is_error
    assert "cancelled" in text_of(ended)


# --- 2025-11-25: -32042 and notifications/elicitation/complete ----------------------


def test_legacy_error_then_an_early_retry_waits_and_the_webhook_notifies(setup: Setup) -> None:
    messages: list[Any] = []

    async def body(client: Client) -> CallToolResult:
        with pytest.raises(MCPError) as required:
            await client.call_tool("forecast", {"city": "Oslo"})
        assert required.value.code == URL_ELICITATION_REQUIRED
        [params] = required.value.data["elicitations"]
        assert params["mode"] == "url"
        assert params["message"] == "Connect your weather service key"
        elicitation_id = params["elicitationId"]
        assert params["url"] == f"{setup.served.origin}/e/{elicitation_id}"
        assert setup.notifier.watching(elicitation_id)
        # The user opens the link; the client retries at once, before they submit.
        setup.user.enter_key_later(params["url"], KEY, delay=1.5)
        result = await client.call_tool("forecast", {"city": "Oslo"})
        # The gateway's webhook arrives; the session that asked is notified.
        headers, payload = sign(setup.webhook_secret, {
            "type": "elicitation.completed", "timestamp": "2026-01-01T00:00:00Z",
            "data": {"elicitation_id": elicitation_id, "status": "completed"}})
        assert await setup.notifier.handle(headers, payload)
        assert not await setup.notifier.handle(headers, payload)  # a redelivery: once only
        await anyio.sleep(0.2)
        return result

    result = run(setup, LEGACY, body, messages=messages)
    assert text_of(result) == "sunny in Oslo (key …8e0c)"
    assert setup.tool_runs == ["2025-11-25", "2025-11-25"]
    notices = [m for m in messages if isinstance(m, ElicitCompleteNotification)]
    [notice] = notices
    [asked] = setup.gateway.list_elicitations(subject=setup.subject)
    assert notice.params.elicitation_id == asked.id


def test_legacy_a_retry_after_the_user_finished_uses_the_vault(setup: Setup) -> None:
    async def body(client: Client) -> CallToolResult:
        with pytest.raises(MCPError) as required:
            await client.call_tool("forecast", {"city": "Oslo"})
        [params] = required.value.data["elicitations"]
        await anyio.to_thread.run_sync(setup.user.log_in)
        await anyio.to_thread.run_sync(setup.user.enter_key, params["url"], KEY)
        return await client.call_tool("forecast", {"city": "Oslo"})

    result = run(setup, LEGACY, body)
    assert text_of(result) == "sunny in Oslo (key …8e0c)"


def test_legacy_a_retry_while_the_user_is_still_away_repeats_the_same_link(
    served: ServedGateway, user: User,
) -> None:
    setup = make_setup(served, user, retry_wait=1)

    async def body(client: Client) -> list[str]:
        ids = []
        for _ in range(2):
            with pytest.raises(MCPError) as required:
                await client.call_tool("premium", {"order": "o-7"})
            assert required.value.code == URL_ELICITATION_REQUIRED
            ids.append(required.value.data["elicitations"][0]["elicitationId"])
        return ids

    started = time.monotonic()
    first, second = run(setup, LEGACY, body)
    assert first == second
    assert time.monotonic() - started >= 1  # the retry waited for the user first
    [asked] = setup.gateway.list_elicitations(subject=setup.subject)
    assert asked.id == first


def test_webhooks_that_are_not_authentic_or_not_completions_notify_nobody(setup: Setup) -> None:
    sent: list[str] = []

    class Session:
        async def send_elicit_complete(self, elicitation_id: str) -> None:
            sent.append(elicitation_id)

    async def main() -> None:
        setup.notifier.watch("el_a", Session())
        setup.notifier.watch("el_b", Session())
        headers, body = sign(setup.webhook_secret, {
            "type": "elicitation.declined", "data": {"elicitation_id": "el_a"}})
        assert not await setup.notifier.handle(headers, body)
        headers, body = sign("whsec_" + base64.b64encode(b"w" * 32).decode(), {
            "type": "elicitation.completed", "data": {"elicitation_id": "el_b"}})
        with pytest.raises(Exception, match="signature"):
            await setup.notifier.handle(headers, body)
        headers, body = sign(setup.webhook_secret, {
            "type": "elicitation.completed", "data": {"elicitation_id": "el_b"}})
        assert await setup.notifier.handle(headers, body)

    anyio.run(main)
    assert sent == ["el_b"]
    assert not setup.notifier.watching("el_a")


# --- OAuth connections: oauth_token ------------------------------------------------------


def connect(setup: Setup) -> str:
    """The user connected their Forge account earlier (for another call of the tool)."""
    asked = setup.gateway.request_oauth(setup.subject, OAUTH_TYPE, "Connect your Forge account",
                                        scopes=["read:user"])
    return setup.served.connect_account(asked.id, ACCESS_TOKEN, account="octocat")


async def never_asked(_context: Any, _params: ElicitRequestURLParams) -> ElicitResult:
    pytest.fail("the user was asked although a connection is stored")


@pytest.mark.parametrize("mode", [LEGACY, MODERN])
def test_a_stored_connection_gives_its_token_without_asking(setup: Setup, mode: str) -> None:
    connect(setup)
    before = len(setup.gateway.list_elicitations(subject=setup.subject))
    result = run(setup, mode, lambda c: c.call_tool("repos", {}), on_elicit=never_asked)
    assert text_of(result) == "repos of octocat (token …5e7d)"
    assert len(setup.tool_runs) == 1
    assert len(setup.gateway.list_elicitations(subject=setup.subject)) == before


def test_modern_with_no_connection_the_user_is_sent_to_connect_one(setup: Setup) -> None:
    async def body(client: Client) -> InputRequiredResult:
        first = await client.session.call_tool("repos", {}, allow_input_required=True)
        assert isinstance(first, InputRequiredResult)
        return first

    first = run(setup, MODERN, body)
    [(elicitation_id, request)] = (first.input_requests or {}).items()
    params = request.params
    assert isinstance(params, ElicitRequestURLParams)
    assert (params.mode, params.message) == ("url", "Connect your Forge account")
    assert params.url == f"{setup.served.origin}/e/{elicitation_id}"
    assert params.elicitation_id is None
    [asked] = setup.gateway.list_elicitations(subject=setup.subject)
    assert (asked.id, asked.kind, asked.credential_type, asked.scopes) == (
        elicitation_id, "oauth", OAUTH_TYPE, ["read:user"])


def test_legacy_with_no_connection_the_tool_answers_minus_32042(setup: Setup) -> None:
    async def body(client: Client) -> MCPError:
        with pytest.raises(MCPError) as required:
            await client.call_tool("repos", {})
        return required.value

    error = run(setup, LEGACY, body)
    assert error.code == URL_ELICITATION_REQUIRED
    [params] = error.data["elicitations"]
    [asked] = setup.gateway.list_elicitations(subject=setup.subject, kind="oauth")
    assert params == {"mode": "url", "message": "Connect your Forge account",
                      "url": asked.url, "elicitationId": asked.id}
    assert setup.notifier.watching(asked.id)


def test_modern_the_user_connects_and_the_retry_gets_the_token(setup: Setup) -> None:
    async def on_elicit(_context: Any, params: ElicitRequestURLParams) -> ElicitResult:
        elicitation_id = params.url.rsplit("/", 1)[-1]
        await anyio.to_thread.run_sync(lambda: setup.served.connect_account(
            elicitation_id, ACCESS_TOKEN, account="octocat"))
        return ElicitResult(action="accept")

    result = run(setup, MODERN, lambda c: c.call_tool("repos", {}), on_elicit=on_elicit)
    assert text_of(result) == "repos of octocat (token …5e7d)"
    assert setup.tool_runs == [MODERN, MODERN]


@pytest.mark.parametrize("mode", [LEGACY, MODERN])
def test_a_connection_the_provider_will_not_refresh_is_asked_for_again(
    served: ServedGateway, user: User, mode: str,
) -> None:
    class RefreshRefused(GatewayClient):
        """A gateway whose provider refuses the refresh the next reveal needs."""

        def reveal_credential(self, credential_id: str) -> RevealedCredential:
            # The gateway revokes a connection whose refresh was refused (invalid_grant),
            # then answers its reveal with 409 reconnect-required.
            served.refresh_refused(credential_id)
            return super().reveal_credential(credential_id)

    setup = make_setup(served, user, client_class=RefreshRefused)
    old = connect(setup)

    async def body(client: Client) -> Any:
        if mode == LEGACY:
            with pytest.raises(MCPError) as required:
                await client.call_tool("repos", {})
            return required.value.code
        return await client.session.call_tool("repos", {}, allow_input_required=True)

    answer = run(setup, mode, body)
    if mode == LEGACY:
        assert answer == URL_ELICITATION_REQUIRED
    else:
        assert isinstance(answer, InputRequiredResult)
        assert len(answer.input_requests or {}) == 1
    newest = setup.gateway.list_elicitations(subject=setup.subject, kind="oauth").items[0]
    assert (newest.status, newest.scopes) == ("pending", ["read:user"])
    assert setup.gateway.find_credential(setup.subject, OAUTH_TYPE) is None
    [revoked] = setup.gateway.list_credentials(subject=setup.subject, include_revoked=True)
    assert (revoked.id, revoked.revoked_reason) == (old, "refresh-failed")
