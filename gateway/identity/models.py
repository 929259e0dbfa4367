"""Local accounts and browser sessions."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from gateway.db import Base, UTCDateTime


class User(Base):
    """A local account (login backend ``local``); its subject is (public URL, username)."""

    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    username: Mapped[str] = mapped_column(String(64), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(20), default="active")  # active | disabled
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    password_changed_at: Mapped[datetime] = mapped_column(UTCDateTime)
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    @property
    def active(self) -> bool:
        return self.status == "active"


class BrowserSession(Base):
    """A browser's server-side session; the cookie holds a random id, the row its digest."""

    __tablename__ = "browser_sessions"
    __table_args__ = (Index("ix_browser_sessions_subject", "subject_iss", "subject_sub"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    # Null until the user logs in; then the (iss, sub) pair the login proved.
    subject_iss: Mapped[str | None] = mapped_column(String(500))
    subject_sub: Mapped[str | None] = mapped_column(String(255))
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


class LoginCounter(Base):
    """The login attempts counted against one account or one address in its current window.

    ``key`` is a keyed digest ("login-account:<name>" or "login-ip:<address>"
    under the pepper): the table names neither a user nor an address.
    """

    __tablename__ = "login_counters"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    window_start: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    attempts: Mapped[int] = mapped_column(Integer)
