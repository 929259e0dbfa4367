"""The outbox of webhook events, and every attempt to deliver them."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from gateway.db import Base, UTCDateTime


class WebhookEvent(Base):
    """One event for one client, written in the transaction of the change it reports.

    ``id`` is the ``webhook-id`` header: the same on every attempt, so the
    receiver can drop duplicates. ``body`` is kept as the exact bytes sent,
    so every attempt carries the same payload.
    """

    __tablename__ = "webhook_events"
    __table_args__ = (Index("ix_webhook_events_due", "status", "next_attempt_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    client_id: Mapped[str] = mapped_column(ForeignKey("clients.id"), index=True)
    type: Mapped[str] = mapped_column(String(50))
    elicitation_id: Mapped[str | None] = mapped_column(String(40), index=True)
    body: Mapped[str] = mapped_column(Text)
    # pending: due at next_attempt_at; delivering: claimed until lease_until;
    # delivered; dead: every attempt of the schedule failed.
    status: Mapped[str] = mapped_column(String(20))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime)
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_error: Mapped[str | None] = mapped_column(String(500))


class WebhookAttempt(Base):
    """One try at delivering an event: when, what came back, how long it took."""

    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(ForeignKey("webhook_events.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    status_code: Mapped[int | None] = mapped_column(Integer)
    latency_ms: Mapped[int] = mapped_column(Integer)
    outcome: Mapped[str] = mapped_column(String(20))  # delivered | failed
    error: Mapped[str | None] = mapped_column(String(500))


class WorkerHeartbeat(Base):
    """When a running dispatcher last looked for due events.

    One row per worker process, written a few times per lease and deleted
    when the worker stops; a killed worker's row simply ages.
    """

    __tablename__ = "worker_heartbeats"

    # host:pid:random, so a reused pid or a host's twin never shares a row.
    id: Mapped[str] = mapped_column(String(100), primary_key=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    polled_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
