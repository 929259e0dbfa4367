"""Ask for a key, a connected account or a payment inside an MCP tool, on either protocol version.

One call in the tool serves both versions clients speak today:

* **2025-11-25**: the first call raises ``UrlElicitationRequiredError``
  (-32042) naming the gateway's link; the client shows it and retries the
  tool call. The retry finds the same elicitation again (the gateway returns
  a still-open one for the same subject and type, or the same answer for the
  same ``Idempotency-Key``) and waits on it for a bounded time, so a retry
  that arrives before the user has finished still succeeds when they finish
  shortly after. A :class:`CompletionNotifier` can tell the client when to retry.
* **2026-07-28**: the first call returns an ``InputRequiredResult`` whose
  ``inputRequests`` hold the URL elicitation and whose ``requestState``
  carries the gateway's elicitation id (the SDK seals it, so the client
  cannot forge it). On the retry the id is read back and waited on; while the
  user is still busy the answer is another ``InputRequiredResult`` carrying
  only the state, so the client retries without asking the user again.

>>> key = await gateway.api_key(ctx, subject, "openai", "Connect your OpenAI key")
>>> if isinstance(key, InputRequiredResult):
...     return key
>>> use(key.secret)

:meth:`GatewayElicitations.oauth_token` works the same way for an account
the user connects at a third-party provider; its ``secret`` is an access
token.

Whatever goes wrong on the way to the gateway (it refuses the call, or does
not answer) ends the tool call as a :class:`GatewayCallFailed`: a tool error
whose text is the gateway's own ``title: detail``, so the user learns what is
wrong instead of the SDK's bare "Error executing tool".
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final, TypeVar

import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import UrlElicitationRequiredError
from mcp_types import ElicitRequest, ElicitRequestURLParams, ElicitResult, InputRequiredResult
from mcp_types.version import is_version_at_least

from gateway.client.api import GatewayClient
from gateway.client.errors import Conflict, GatewayClientError, ReconnectRequired
from gateway.client.mcp.notify import CompletionNotifier
from gateway.client.models import CredentialKind, Elicitation, RevealedCredential, Subject

# The first version that carries elicitations inside InputRequiredResult.
MULTI_ROUND_TRIP: Final = "2026-07-28"
DEFAULT_RETRY_WAIT: Final = 20.0
# The key of this module's entries inside a tool call's requestState.
_STATE_KEY: Final = "gateway"
# The metadata entry that ties a payment elicitation to its order.
_ORDER_KEY: Final = "mcp_order"
_T = TypeVar("_T")

log = logging.getLogger(__name__)


class ElicitationNotCompleted(ToolError):
    """The user declined, or the link expired, was cancelled or failed.

    A ``ToolError``: left uncaught in a tool, the call ends with ``isError``
    and this message, which the model can relay.
    """

    _WORDS: Final = {
        "declined": "The user declined the request",
        "expired": "The link expired before the user finished",
        "cancelled": "The request was cancelled",
        "failed": "The payment failed",
    }

    def __init__(self, elicitation: Elicitation) -> None:
        self.elicitation = elicitation
        words = self._WORDS.get(elicitation.status, f"The request ended as {elicitation.status}")
        super().__init__(f"{words}; call the tool again to ask anew.")


class GatewayCallFailed(ToolError):
    """The gateway refused a call or did not answer; the message says why, in its own words.

    A ``ToolError``, so the MCP client gets ``isError`` with the problem's
    ``title: detail`` ("Payments are not configured: ...") or "The gateway at
    <url> did not answer: ...". ``error`` is the SDK's exception, for code that
    catches this to branch on ``status`` or ``code``.
    """

    def __init__(self, error: GatewayClientError) -> None:
        self.error = error
        super().__init__(error.describe())


class UrlElicitationUnsupported(ToolError):
    """The client declared no URL-mode elicitation; the message gives the user the link."""

    def __init__(self, elicitation: Elicitation) -> None:
        self.elicitation = elicitation
        super().__init__(f"{elicitation.message} Open {elicitation.url} in a browser, "
                         "finish there, then call this tool again.")


def is_multi_round_trip(ctx: Context[Any, Any]) -> bool:
    """Whether this request speaks 2026-07-28 or later (InputRequiredResult, requestState)."""
    version = ctx.protocol_version
    return version is not None and is_version_at_least(version, MULTI_ROUND_TRIP)


class GatewayElicitations:
    """The gateway's elicitations for the tools of one MCP server (``mcp`` SDK, ``MCPServer``).

    ``retry_wait`` bounds how long a retry waits on the gateway for the user
    to finish (a long-poll; at most 60 s per poll). ``notifier`` receives the
    2025-11-25 elicitations to announce on completion.
    """

    def __init__(self, client: GatewayClient, *, retry_wait: float = DEFAULT_RETRY_WAIT,
                 ttl_seconds: int | None = None,
                 notifier: CompletionNotifier | None = None) -> None:
        self.client = client
        self.retry_wait = retry_wait
        self.ttl_seconds = ttl_seconds
        self.notifier = notifier

    async def api_key(
        self, ctx: Context[Any, Any], subject: Subject, credential_type: str, message: str, *,
        metadata: Mapping[str, Any] | None = None,
    ) -> RevealedCredential | InputRequiredResult:
        """The user's stored key of this type, or the step that asks them for it.

        Returns the revealed key when the gateway's vault holds one (or once
        the user has entered it); an ``InputRequiredResult`` to return from
        the tool as is (2026-07-28); raises ``UrlElicitationRequiredError``
        (2025-11-25) or :class:`ElicitationNotCompleted`.
        """
        def ask() -> Elicitation:
            return self.client.request_api_key(subject, credential_type, message,
                                               ttl_seconds=self.ttl_seconds, metadata=metadata)

        return await self._credential(ctx, "api_key", subject, credential_type, ask)

    async def oauth_token(
        self, ctx: Context[Any, Any], subject: Subject, credential_type: str, message: str, *,
        scopes: Sequence[str] | None = None, metadata: Mapping[str, Any] | None = None,
    ) -> RevealedCredential | InputRequiredResult:
        """An access token of the user's connected account, or the step that asks them to connect.

        As :meth:`api_key`, for a credential type of kind ``oauth``: the
        ``secret`` of what comes back is a working access token (the gateway
        refreshes it when needed), with ``token_type``, ``expires_at``,
        ``scopes`` and ``account``. A connection the provider will no longer
        refresh (``reconnect-required``) is asked for again. ``scopes``, when
        given, are asked for in a new connection; a stored one is used with
        whatever it was granted (see ``scopes`` of the result). While the
        provider does not answer a needed refresh, raises :class:`GatewayCallFailed`
        whose ``error`` is a :class:`~gateway.client.errors.ProviderUnavailable`.
        """
        def ask() -> Elicitation:
            return self.client.request_oauth(subject, credential_type, message, scopes=scopes,
                                             ttl_seconds=self.ttl_seconds, metadata=metadata)

        return await self._credential(ctx, "oauth", subject, credential_type, ask)

    async def payment(
        self, ctx: Context[Any, Any], subject: Subject, payment: Mapping[str, Any],
        message: str, *, order_id: str, metadata: Mapping[str, Any] | None = None,
    ) -> Elicitation | InputRequiredResult:
        """The completed payment elicitation for this order, or the step that asks for it.

        ``order_id`` names the purchase (stable across the client's retries,
        unique per purchase): the same order is never charged twice within
        the gateway's 24-hour idempotency window, and a new order is never
        taken for paid by an earlier one. Ask for an order with the same
        ``payment``, ``message`` and ``metadata`` every time.
        """
        client = self.client
        digest = hashlib.sha256("\0".join((subject.iss, subject.sub, order_id)).encode())
        marker = f"mcp-order-{digest.hexdigest()[:48]}"

        def earlier() -> Elicitation | None:
            # The order's elicitation, if it was asked for before (a 2025-11-25 retry).
            for asked in client.iter_elicitations(subject=subject, kind="payment"):
                if asked.metadata.get(_ORDER_KEY) == marker:
                    return asked
            return None

        def create() -> Elicitation:
            # reuse_pending is off: the order, not the amount, says which elicitation is
            # whose. The Idempotency-Key stops two racing calls from making two.
            return client.request_payment(
                subject, payment, message, ttl_seconds=self.ttl_seconds,
                metadata={**(metadata or {}), _ORDER_KEY: marker}, reuse_pending=False,
                idempotency_key=marker)

        return await self._resolve(ctx, f"payment:{order_id}", None, create, lambda done: done,
                                   earlier=earlier)

    # --- the shared flow -------------------------------------------------------------

    async def _credential(
        self, ctx: Context[Any, Any], kind: CredentialKind, subject: Subject,
        credential_type: str, ask: Callable[[], Elicitation],
    ) -> RevealedCredential | InputRequiredResult:
        """The subject's live key or connection of this type, revealed, or ``ask`` for one."""
        client = self.client

        def stored() -> RevealedCredential | None:
            found = client.find_credential(subject, credential_type)
            if found is None:
                return None
            try:
                return client.reveal_credential(found.id)
            except ReconnectRequired:
                # The provider refused the refresh and the gateway revoked the
                # connection: as good as none stored, so the user is asked again.
                return None

        def finish(done: Elicitation) -> RevealedCredential:
            found = client.find_credential(subject, credential_type, elicitation_id=done.id)
            if found is None:
                # Entered, then revoked at once: as good as not entered.
                raise ElicitationNotCompleted(done)
            return client.reveal_credential(found.id)

        return await self._resolve(ctx, f"{kind}:{credential_type}", stored, ask, finish)

    async def _resolve(
        self, ctx: Context[Any, Any], purpose: str, stored: Callable[[], _T | None] | None,
        create: Callable[[], Elicitation], finish: Callable[[Elicitation], _T], *,
        earlier: Callable[[], Elicitation | None] | None = None,
    ) -> _T | InputRequiredResult:
        modern = is_multi_round_trip(ctx)
        state = _read_state(ctx) if modern else {}
        asked = state.get(purpose)
        if asked is not None:
            return await self._resume(ctx, asked, state, finish)
        if stored is not None:
            found = await _in_thread(stored)
            if found is not None:
                return found
        elicitation = await _in_thread(earlier) if earlier is not None else None
        if elicitation is None:
            elicitation = await _in_thread(create)
        if not elicitation.created:
            # Asked before (a still-open one came back, or the order's own).
            # On 2025-11-25 this is most likely the client's retry: give the
            # user a little time to finish.
            elicitation = await _in_thread(partial(
                self.client.wait_for_elicitation, elicitation.id,
                timeout=0 if modern else self.retry_wait))
        if elicitation.status == "completed":
            return await _in_thread(partial(finish, elicitation))
        if elicitation.is_terminal:
            raise ElicitationNotCompleted(elicitation)
        if not _supports_url_mode(ctx):
            raise UrlElicitationUnsupported(elicitation)
        if modern:
            state[purpose] = elicitation.id
            return InputRequiredResult(
                input_requests={elicitation.id: ElicitRequest(params=ElicitRequestURLParams(
                    message=elicitation.message, url=elicitation.url))},
                request_state=_dump_state(ctx, state))
        if self.notifier is not None:
            self.notifier.watch(elicitation.id, ctx.session)
        raise UrlElicitationRequiredError([ElicitRequestURLParams(
            message=elicitation.message, url=elicitation.url, elicitation_id=elicitation.id)])

    async def _resume(self, ctx: Context[Any, Any], elicitation_id: str, state: dict[str, str],
                      finish: Callable[[Elicitation], _T]) -> _T | InputRequiredResult:
        """The retry of a 2026-07-28 round: wait on the elicitation named in requestState."""
        response = (ctx.input_responses or {}).get(elicitation_id)
        if isinstance(response, ElicitResult) and response.action != "accept":
            # The user would not open the link: end it, so it cannot be finished later.
            raise ElicitationNotCompleted(await _in_thread(partial(self._cancel, elicitation_id)))
        elicitation = await _in_thread(partial(
            self.client.wait_for_elicitation, elicitation_id, timeout=self.retry_wait))
        if elicitation.status == "completed":
            return await _in_thread(partial(finish, elicitation))
        if elicitation.is_terminal:
            raise ElicitationNotCompleted(elicitation)
        # Still open: state only, so the client retries without asking the user again.
        return InputRequiredResult(request_state=_dump_state(ctx, state))

    def _cancel(self, elicitation_id: str) -> Elicitation:
        try:
            return self.client.cancel_elicitation(elicitation_id)
        except Conflict:
            # It ended meanwhile (the user may even have finished); report how it ended.
            return self.client.get_elicitation(elicitation_id)


async def _in_thread(call: Callable[[], _T]) -> _T:
    """Run a call to the gateway; a refusal or silence becomes the tool's error, in words.

    The client is blocking (requests); a worker thread keeps the event loop free.
    """
    try:
        return await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
    except GatewayClientError as error:
        # The whole story (status, request id) for the operator; the words for the user.
        log.warning("gateway call failed: %s", error)
        raise GatewayCallFailed(error) from error


def _supports_url_mode(ctx: Context[Any, Any]) -> bool:
    capabilities = ctx.client_capabilities
    if capabilities is None:
        return True  # not declared on this transport: let the client decide
    return capabilities.elicitation is not None and capabilities.elicitation.url is not None


def _read_state(ctx: Context[Any, Any]) -> dict[str, str]:
    """This module's entries of the requestState (the SDK has already verified and unsealed it)."""
    try:
        whole = json.loads(ctx.request_state or "{}")
    except ValueError:
        return {}
    ours = whole.get(_STATE_KEY) if isinstance(whole, dict) else None
    if not isinstance(ours, dict):
        return {}
    return {k: v for k, v in ours.items() if isinstance(k, str) and isinstance(v, str)}


def _dump_state(ctx: Context[Any, Any], ours: dict[str, str]) -> str:
    """The requestState for the next round, keeping entries other code put there."""
    try:
        whole = json.loads(ctx.request_state or "{}")
    except ValueError:
        whole = {}
    if not isinstance(whole, dict):
        whole = {}
    whole[_STATE_KEY] = ours
    return json.dumps(whole, separators=(",", ":"))
