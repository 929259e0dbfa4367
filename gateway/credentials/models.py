"""Credentials users handed over, sealed by the vault."""

from __future__ import annotations

from datetime import datetime
from typing import Final

from sqlalchemy import ForeignKey, Index, String, text
from sqlalchemy.orm import Mapped, mapped_column

from gateway.db import Base, UTCDateTime
from gateway.vault.models import SealedColumns

# The index that holds each owner's one live credential; the database
# refuses a second, and a capture tells that refusal by this name.
LIVE_OWNER_INDEX: Final = "ix_credentials_live_owner"


class Credential(SealedColumns, Base):
    """One user's key for one client and type; readable only through the vault."""

    __tablename__ = "credentials"
    __table_args__ = (
        Index("ix_credentials_owner", "client_id", "subject_iss", "subject_sub", "type"),
        # An owner's one live credential, found without reading the revoked
        # ones; the database refuses a second.
        Index(LIVE_OWNER_INDEX, "client_id", "subject_iss", "subject_sub", "type",
              unique=True, sqlite_where=text("revoked_at IS NULL"),
              postgresql_where=text("revoked_at IS NULL")),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    client_id: Mapped[str] = mapped_column(ForeignKey("clients.id"))
    subject_iss: Mapped[str] = mapped_column(String(500))
    subject_sub: Mapped[str] = mapped_column(String(255))
    type: Mapped[str] = mapped_column(String(50))
    # Enough to recognise the key ("sk-…a1b2"), never enough to use it.
    hint: Mapped[str] = mapped_column(String(20))
    elicitation_id: Mapped[str] = mapped_column(ForeignKey("elicitations.id"), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    @property
    def live(self) -> bool:
        return self.revoked_at is None
