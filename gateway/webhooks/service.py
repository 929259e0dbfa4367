"""The operator's view of the outbox: list, inspect, redeliver, test."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta
from typing import Any

import requests
from sqlalchemy import Connection, and_, case, func, or_, select
from sqlalchemy.orm import Session

from gateway.audit import service as audit
from gateway.clients.models import Client
from gateway.clients.service import current_webhook_secrets
from gateway.clock import Clock
from gateway.errors import Conflict, InvalidInput, NotFound
from gateway.outbound import BlockedDestination, OutboundPolicy, guarded_session
from gateway.pagination import timestamp
from gateway.tokens import new_id
from gateway.vault.envelope import VaultError
from gateway.vault.keyring import KeyringError, KeySource
from gateway.webhooks import signing
from gateway.webhooks.dispatcher import CANNOT_SIGN
from gateway.webhooks.models import WebhookAttempt, WebhookEvent, WorkerHeartbeat

STATUSES = ("pending", "delivering", "delivered", "dead")


def represent(event: WebhookEvent) -> dict[str, Any]:
    return {"id": event.id, "client_id": event.client_id, "type": event.type,
            "elicitation_id": event.elicitation_id, "status": event.status,
            "attempts": event.attempts, "created_at": timestamp(event.created_at),
            "next_attempt_at": timestamp(event.next_attempt_at) if event.status == "pending"
            else None, "delivered_at": timestamp(event.delivered_at),
            "last_error": event.last_error}


def list_events(session: Session, *, status: str | None, client_id: str | None,
                limit: int) -> list[WebhookEvent]:
    query = select(WebhookEvent).order_by(WebhookEvent.created_at.desc()).limit(limit)
    if status is not None:
        query = query.where(WebhookEvent.status == status)
    if client_id is not None:
        query = query.where(WebhookEvent.client_id == client_id)
    return list(session.scalars(query))


def get_event(session: Session, event_id: str) -> WebhookEvent:
    event = session.get(WebhookEvent, event_id)
    if event is None:
        raise NotFound(f"no webhook event {event_id!r}")
    return event


def attempts_of(session: Session, event_id: str) -> list[WebhookAttempt]:
    """Every attempt, in the order they started.

    Not by number: a redelivery starts the count again at 1, and its attempts
    belong after the ones before it.
    """
    return list(session.scalars(select(WebhookAttempt).where(
        WebhookAttempt.event_id == event_id).order_by(WebhookAttempt.started_at,
                                                      WebhookAttempt.id)))


def redeliver(session: Session, clock: Clock, event_id: str, *, actor: str) -> WebhookEvent:
    """Queue an event again, at once, with the same ``webhook-id`` and body."""
    event = get_event(session, event_id)
    if event.status == "delivering":
        raise Conflict(f"event {event_id} is being delivered right now")
    previous = event.status
    event.status = "pending"
    event.attempts = 0
    event.next_attempt_at = clock.now()
    event.lease_until = None
    audit.record(session, clock, actor=actor, action="webhook.redelivered", target=event.id,
                 details={"client_id": event.client_id, "previous_status": previous})
    return event


def last_poll(connection: Connection) -> datetime | None:
    """When any running worker last looked for due events; None if none is running."""
    polled: datetime | None = connection.scalar(select(func.max(WorkerHeartbeat.polled_at)))
    return polled


def stalled(connection: Connection, now: datetime, lease: timedelta) -> str | None:
    """Why no webhook is going out, or None while they are.

    Stalled means events overdue by more than a lease while no worker has
    looked for due events within one: a live worker looks several times per
    lease even when every thread is sending, so this is a dead or stuck one,
    or none at all.
    """
    cutoff = now - lease
    # A claim whose lease ran out is as due as a pending event.
    due_at = case((WebhookEvent.status == "pending", WebhookEvent.next_attempt_at),
                  else_=WebhookEvent.lease_until)
    overdue: datetime | None = connection.scalar(select(func.min(due_at)).where(or_(
        and_(WebhookEvent.status == "pending", WebhookEvent.next_attempt_at < cutoff),
        and_(WebhookEvent.status == "delivering", WebhookEvent.lease_until < cutoff))))
    if overdue is None:
        return None
    polled = last_poll(connection)
    if polled is not None and polled >= cutoff:
        return None
    looked = f"since {timestamp(polled)}" if polled is not None else "at all"
    return (f"webhook events have been due since {timestamp(overdue)} and no worker has "
            f"looked for them {looked}: is `gateway worker` running?")


def send_ping(session: Session, clock: Clock, keyring: KeySource, policy: OutboundPolicy,
              client: Client, *, actor: str) -> dict[str, Any]:
    """Send a signed ``ping`` to the client's webhook URL now; what came back."""
    if not client.webhook_url:
        raise InvalidInput(f"client {client.id} has no webhook URL")
    message_id = new_id("msg_", 18)
    body = json.dumps({"type": "ping", "timestamp": timestamp(clock.now()),
                       "data": {"client_id": client.id}}, separators=(",", ":"))
    try:
        secrets = current_webhook_secrets(session, clock, keyring, client)
    except (VaultError, KeyringError):
        raise Conflict(f"client {client.id}: {CANNOT_SIGN}") from None
    headers = signing.headers(secrets, message_id, int(clock.now().timestamp()), body)
    headers["Content-Type"] = "application/json"
    begun = time.monotonic()
    outcome: dict[str, Any] = {"webhook_id": message_id, "url": client.webhook_url}
    try:
        with guarded_session(policy) as http:
            response = http.post(client.webhook_url, data=body.encode(), headers=headers,
                                 timeout=15, allow_redirects=False)
        outcome.update(status_code=response.status_code,
                       delivered=200 <= response.status_code < 300)
    except BlockedDestination as error:
        outcome.update(status_code=None, delivered=False, error=str(error))
    except requests.RequestException as error:
        outcome.update(status_code=None, delivered=False, error=type(error).__name__)
    outcome["latency_ms"] = round((time.monotonic() - begun) * 1000)
    audit.record(session, clock, actor=actor, action="webhook.tested", target=client.id,
                 outcome="success" if outcome["delivered"] else "failure",
                 details={k: v for k, v in outcome.items() if k != "url"})
    return outcome
