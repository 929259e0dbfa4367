"""Checkout Sessions started for payment elicitations, and Stripe events already handled."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from gateway.db import Base, UTCDateTime


class Payment(Base):
    """One Stripe Checkout Session and what became of it.

    An elicitation has one row per attempt: a user whose session expired or
    who left Stripe's page may start again, and each new start is a new
    Checkout Session (``attempt`` 1, 2, ...).
    """

    __tablename__ = "payments"
    __table_args__ = (UniqueConstraint("elicitation_id", "attempt"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    elicitation_id: Mapped[str] = mapped_column(ForeignKey("elicitations.id"), index=True)
    client_id: Mapped[str] = mapped_column(ForeignKey("clients.id"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    checkout_session_id: Mapped[str] = mapped_column(String(255), unique=True)
    # Stripe's hosted page for this session, reused while the session is open
    # so that a second click does not ask Stripe again.
    checkout_url: Mapped[str | None] = mapped_column(String(2000))
    mode: Mapped[str] = mapped_column(String(20))  # payment | subscription
    # open | processing | paid | failed | expired (see service.STATUS_TRANSITIONS)
    status: Mapped[str] = mapped_column(String(20), index=True)
    amount: Mapped[int | None] = mapped_column(Integer)
    currency: Mapped[str | None] = mapped_column(String(3))
    payment_intent_id: Mapped[str | None] = mapped_column(String(255))
    subscription_id: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    session_expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class StripeEvent(Base):
    """A Stripe event id seen once: Stripe delivers at least once, we act at most once."""

    __tablename__ = "stripe_events"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    type: Mapped[str] = mapped_column(String(100))
    checkout_session_id: Mapped[str | None] = mapped_column(String(255), index=True)
    # What the event did: applied, unchanged (an earlier event or the return
    # page got there first), ignored (a type or a session not ours).
    outcome: Mapped[str] = mapped_column(String(20))
    received_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
