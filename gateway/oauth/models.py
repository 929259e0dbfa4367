"""Authorization requests sent to a provider and not yet answered."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from gateway.db import Base, UTCDateTime


class OAuthState(Base):
    """One ``state`` handed to a provider: single use, for one elicitation and one browser.

    Only the keyed digest of the state is stored, and of the browser
    session's id: a copied table answers no callback. The PKCE verifier and
    the nonce are derived from the state under the same key, so they are
    never stored at all.
    """

    __tablename__ = "oauth_states"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    elicitation_id: Mapped[str] = mapped_column(ForeignKey("elicitations.id"))
    session_digest: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
