"""Elicitations and the idempotency records of their creation."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from gateway.db import Base, UTCDateTime


class Elicitation(Base):
    """One request to one user, for one key, one connection or one payment."""

    __tablename__ = "elicitations"
    __table_args__ = (
        # The reuse lookup and the client's filtered listing.
        Index("ix_elicitations_reuse", "client_id", "subject_iss", "subject_sub", "kind",
              "status"),
        # A client's listing, newest first.
        Index("ix_elicitations_client_created", "client_id", "created_at"),
        # The sweeper: open elicitations whose time is up.
        Index("ix_elicitations_status_expires_at", "status", "expires_at"),
        # Those that ended lately: the long-poll watcher, the metrics.
        Index("ix_elicitations_ended_at", "ended_at"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    client_id: Mapped[str] = mapped_column(ForeignKey("clients.id"))
    subject_iss: Mapped[str] = mapped_column(String(500))
    subject_sub: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(20))  # api_key | oauth | payment
    credential_type: Mapped[str | None] = mapped_column(String(50))
    scopes: Mapped[list[str] | None] = mapped_column(JSON)  # oauth: the scopes asked for
    payment: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    message: Mapped[str] = mapped_column(Text)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    status: Mapped[str] = mapped_column(String(20))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    opened_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class IdempotencyRecord(Base):
    """The first answer to a create with an ``Idempotency-Key``, replayed on retries."""

    __tablename__ = "idempotency_records"
    __table_args__ = (UniqueConstraint("client_id", "key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    client_id: Mapped[str] = mapped_column(ForeignKey("clients.id"))
    key: Mapped[str] = mapped_column(String(255))
    # SHA-256 of the canonical request body: the same key with another body is a conflict.
    request_digest: Mapped[str] = mapped_column(String(64))
    status_code: Mapped[int] = mapped_column(Integer)
    response: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)

