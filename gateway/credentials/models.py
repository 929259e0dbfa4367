"""Credentials users handed over, sealed by the vault."""

from __future__ import annotations

from datetime import datetime
from typing import Final

from sqlalchemy import JSON, ForeignKey, Index, String, text
from sqlalchemy.orm import Mapped, mapped_column

from gateway.db import Base, UTCDateTime
from gateway.vault.models import SealedColumns

# The index that holds each owner's one live credential; the database
# refuses a second, and a capture tells that refusal by this name.
LIVE_OWNER_INDEX: Final = "ix_credentials_live_owner"
# The constraint (named by the naming convention) that holds one key per
# elicitation: two tabs that finish one link at once store one key.
ONE_KEY_PER_ELICITATION: Final = "uq_credentials_elicitation_id"


class Credential(SealedColumns, Base):
    """One user's key or connection for one client and type; readable only through the vault.

    An ``api_key`` seals the key itself; an ``oauth`` connection seals its
    token set (see :mod:`gateway.oauth.tokens`) and keeps beside it what may
    be shown: the account, the granted scopes and the access token's expiry.
    """

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
    kind: Mapped[str] = mapped_column(String(20), default="api_key",
                                      server_default="api_key")  # api_key | oauth
    # Enough to recognise the key ("…a1b2"), never enough to use it; null
    # for a type whose catalog entry says ``hint = false``.
    hint: Mapped[str | None] = mapped_column(String(20))
    elicitation_id: Mapped[str] = mapped_column(ForeignKey("elicitations.id"), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # user | client | operator | superseded | refresh-failed
    revoked_reason: Mapped[str | None] = mapped_column(String(40))
    # OAuth connections only.
    account: Mapped[str | None] = mapped_column(String(255))
    scopes: Mapped[list[str] | None] = mapped_column(JSON)
    token_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    refreshed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The refresh lease: while it runs, one process refreshes the token set
    # and every other waits for its result (see gateway.oauth.refresh).
    refresh_lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    refresh_lease_holder: Mapped[str | None] = mapped_column(String(40))

    @property
    def live(self) -> bool:
        return self.revoked_at is None
