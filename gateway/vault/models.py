"""The vault's tables: key versions, instances' heartbeats, and the columns of a sealed secret."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from gateway.db import Base, UTCDateTime
from gateway.vault.envelope import Envelope


class KeyVersion(Base):
    """A key-encryption key, sealed by a root key; every process reads the versions here."""

    __tablename__ = "key_versions"

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    # The root key (a version of the configured keyring) that sealed it.
    root_version: Mapped[int] = mapped_column(Integer)
    wrapped_key: Mapped[bytes] = mapped_column(LargeBinary(64))  # nonce + sealed key + tag
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

    def __repr__(self) -> str:
        return f"KeyVersion(v{self.version}, root v{self.root_version})"


class VaultInstance(Base):
    """A process that wraps data keys, the version it wraps them with, and when it said so."""

    __tablename__ = "vault_instances"

    instance: Mapped[str] = mapped_column(String(200), primary_key=True)  # host:pid.store
    role: Mapped[str] = mapped_column(String(40))
    key_version: Mapped[int] = mapped_column(Integer)
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


class SealedColumns:
    """Mixin: the four columns of an :class:`Envelope`, and nothing readable."""

    key_version: Mapped[int] = mapped_column(Integer, index=True)
    wrapped_key: Mapped[bytes] = mapped_column(LargeBinary(128))
    nonce: Mapped[bytes] = mapped_column(LargeBinary(12))
    ciphertext: Mapped[bytes] = mapped_column(LargeBinary)

    @property
    def envelope(self) -> Envelope:
        """The stored envelope, to open with the keyring."""
        return Envelope(self.key_version, self.wrapped_key, self.nonce, self.ciphertext)

    @envelope.setter
    def envelope(self, value: Envelope) -> None:
        self.key_version = value.key_version
        self.wrapped_key = value.wrapped_key
        self.nonce = value.nonce
        self.ciphertext = value.ciphertext
