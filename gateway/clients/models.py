"""Clients (MCP servers), their API tokens and their webhook signing secrets."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import JSON, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column, relationship

from gateway.db import Base, UTCDateTime
from gateway.vault.models import SealedColumns


class Client(Base):
    """An MCP server that may create elicitations for its users."""

    __tablename__ = "clients"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    status: Mapped[str] = mapped_column(String(20), default="active")  # active | disabled
    webhook_url: Mapped[str | None] = mapped_column(String(2000))
    # Credential type ids this client may ask for; empty means every type.
    credential_types: Mapped[list[str]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    tokens: Mapped[list[ApiToken]] = relationship(back_populates="client",
                                                  order_by="ApiToken.created_at")

    @property
    def active(self) -> bool:
        return self.status == "active"

    def may_use(self, credential_type: str) -> bool:
        """Whether this client may ask its users for keys of ``credential_type``."""
        return not self.credential_types or credential_type in self.credential_types


@dataclass(frozen=True, slots=True)
class ClientIdentity:
    """Who an API request comes from: what the rules need, read without the ORM.

    Authentication runs on every API request, so it reads three columns
    rather than building a mapped object it would throw away.
    """

    id: str
    name: str
    credential_types: tuple[str, ...]

    def may_use(self, credential_type: str) -> bool:
        """Whether this client may ask its users for keys of ``credential_type``."""
        return not self.credential_types or credential_type in self.credential_types


class ApiToken(Base):
    """One bearer token of a client, stored only as its keyed digest."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    client_id: Mapped[str] = mapped_column(ForeignKey("clients.id"), index=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    hint: Mapped[str] = mapped_column(String(20))  # "gw_AbCd…", to tell tokens apart
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    client: Mapped[Client] = relationship(back_populates="tokens")

    @property
    def live(self) -> bool:
        return self.revoked_at is None


class WebhookSecret(SealedColumns, Base):
    """A client's webhook signing secret, sealed by the vault.

    The current secret has no ``retires_at``; after a rotation the previous
    one keeps signing alongside it until ``retires_at`` passes.
    """

    __tablename__ = "webhook_secrets"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    client_id: Mapped[str] = mapped_column(ForeignKey("clients.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    retires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
