"""From the gateway's ``elicitation.completed`` webhook to ``notifications/elicitation/complete``.

On protocol 2025-11-25 a server that answered a tool call with
URLElicitationRequiredError (-32042) should tell the client when the user has
finished, so the client can retry at once instead of waiting for the user to
say so. The gateway reports the finish by webhook, to whichever process of the
MCP server receives it; this notifier remembers which MCP connection asked for
each elicitation and sends the notification on that connection's standalone
channel (the request that raised the error has ended by then).

It holds connections in this process only. Behind a load balancer with
several MCP server processes, route webhooks to the process that owns the
session, or fan them out to all of them; a process that does not know an
elicitation ignores it. Clients must not rely on the notification anyway
(delivery is not guaranteed by the spec): the retry's bounded wait covers a
lost one.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.client.webhooks import WebhookVerificationError, verify_webhook

logger = logging.getLogger(__name__)

# How long a connection is remembered for an elicitation: the gateway's longest TTL.
DEFAULT_REMEMBER_SECONDS: Final = 24 * 3600
DEFAULT_MAX_WATCHED: Final = 10_000
_MAX_SEEN_DELIVERIES: Final = 10_000


class CompletionSender(Protocol):
    """What the notifier needs of an MCP session: ``ServerSession`` has it."""

    async def send_elicit_complete(self, elicitation_id: str) -> None: ...


class CompletionNotifier:
    """Checks the gateway's webhooks; notifies the MCP session that started each elicitation."""

    def __init__(self, webhook_secret: str, *, remember_seconds: float = DEFAULT_REMEMBER_SECONDS,
                 max_watched: int = DEFAULT_MAX_WATCHED) -> None:
        self._secret = webhook_secret
        self._remember = remember_seconds
        self._max_watched = max_watched
        self._watched: OrderedDict[str, tuple[CompletionSender, float]] = OrderedDict()
        self._seen: OrderedDict[str, None] = OrderedDict()

    def __repr__(self) -> str:
        return f"CompletionNotifier(watching={len(self._watched)}, webhook_secret='***')"

    def watch(self, elicitation_id: str, session: CompletionSender) -> None:
        """Notify ``session`` (``notifications/elicitation/complete``) when this one completes."""
        self._watched.pop(elicitation_id, None)
        self._watched[elicitation_id] = (session, time.monotonic() + self._remember)
        # Bounded: the oldest watch goes first, so a flood of asks cannot grow memory.
        while len(self._watched) > self._max_watched:
            self._watched.popitem(last=False)

    def watching(self, elicitation_id: str) -> bool:
        return elicitation_id in self._watched

    async def handle(self, headers: Mapping[str, str], body: bytes) -> bool:
        """Process one delivery; whether a notification was sent.

        Raises :class:`WebhookVerificationError` for a delivery that is not
        authentic or not fresh. A delivery seen before (same ``webhook-id``:
        the gateway's retry) does nothing the second time.
        """
        event = verify_webhook(self._secret, headers, body)
        delivery = {name.lower(): value for name, value in headers.items()}["webhook-id"]
        if delivery in self._seen:
            return False
        self._seen[delivery] = None
        while len(self._seen) > _MAX_SEEN_DELIVERIES:
            self._seen.popitem(last=False)
        data: Any = event.get("data")
        elicitation_id = data.get("elicitation_id") if isinstance(data, dict) else None
        if not isinstance(elicitation_id, str):
            return False
        entry = self._watched.pop(elicitation_id, None)
        if entry is None or entry[1] < time.monotonic():
            return False
        if event.get("type") != "elicitation.completed":
            # Declined, expired, cancelled, failed: there is nothing to retry for.
            return False
        session, _ = entry
        try:
            await session.send_elicit_complete(elicitation_id)
        except Exception:
            # The client went away; its next call finds the result anyway.
            logger.info("could not notify the MCP session of elicitation %s", elicitation_id,
                        exc_info=True)
            return False
        return True

    async def endpoint(self, request: Request) -> Response:
        """A Starlette endpoint for the webhook URL (``MCPServer.custom_route``)."""
        body = await request.body()
        try:
            await self.handle(dict(request.headers), body)
        except WebhookVerificationError as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        return Response(status_code=204)
