"""Writing webhook events into the outbox, inside the caller's transaction.

No commit, no event; a commit, exactly one event. Nothing is sent from here:
the dispatcher picks the row up after the commit (woken by the change signal).
"""

from __future__ import annotations

import json
from typing import Any, Final

from sqlalchemy import insert
from sqlalchemy.orm import Session

from gateway import changes
from gateway.clock import Clock
from gateway.pagination import timestamp
from gateway.tokens import new_id
from gateway.webhooks.models import WebhookEvent

CHANGE_TOPIC: Final = "webhook"


def enqueue(session: Session, clock: Clock, client_id: str, webhook_url: str | None,
            event_type: str, data: dict[str, Any], *,
            elicitation_id: str | None = None) -> str | None:
    """Add an event for the client; its id, or None when it has no webhook URL to send it to."""
    if not webhook_url:
        return None
    now = clock.now()
    body = json.dumps({"type": event_type, "timestamp": timestamp(now), "data": data},
                      separators=(",", ":"), ensure_ascii=False)
    event_id = new_id("msg_", 18)
    # Inserted at once by a statement built once: nothing in the transaction
    # changes the row again.
    session.connection().execute(_INSERT, {
        "id": event_id, "client_id": client_id, "type": event_type,
        "elicitation_id": elicitation_id, "body": body, "status": "pending", "attempts": 0,
        "next_attempt_at": now, "created_at": now})
    changes.announce(session, CHANGE_TOPIC)
    return event_id


_INSERT: Final = insert(WebhookEvent)
