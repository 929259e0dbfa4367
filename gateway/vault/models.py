"""The vault's tables: key versions, instances' heartbeats, and the columns of a sealed secret."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from gateway.db import Base, UTCDateTime
from gateway.vault.envelope import Envelope, seal
from gateway.vault.keyring import KeySource


class KeyVersion(Base):
    """A key-encryption key, sealed by a root key; every process reads the versions here."""

    __tablename__ = "key_versions"

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    # The root key (a version of the configured keyring) that sealed it. Both
    # are NULL for a version of the configured keyring itself, not carried
    # into the table yet (see :mod:`gateway.vault.versions`): its row is here
    # only so that the secrets it wraps can refer to it.
    root_version: Mapped[int | None] = mapped_column(Integer)
    wrapped_key: Mapped[bytes | None] = mapped_column(LargeBinary(64))  # nonce + sealed key + tag
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

    @property
    def carried_over(self) -> bool:
        """Whether the table holds this version's key (else the configured keyring does)."""
        return self.wrapped_key is not None

    def __repr__(self) -> str:
        if not self.carried_over:
            return f"KeyVersion(v{self.version}, in the configured keyring)"
        return f"KeyVersion(v{self.version}, root v{self.root_version})"


class VaultInstance(Base):
    """A process that wraps data keys, the version it wraps them with, and when it said so."""

    __tablename__ = "vault_instances"

    instance: Mapped[str] = mapped_column(String(200), primary_key=True)  # host:pid.store
    role: Mapped[str] = mapped_column(String(40))
    key_version: Mapped[int] = mapped_column(Integer)
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


class SealedColumns:
    """Mixin: the four columns of an :class:`Envelope`, and nothing readable.

    ``key_version`` refers to ``key_versions``, and a version cannot be
    deleted while a row refers to it (RESTRICT): a ``gateway keys retire`` and
    the store of a secret sealed under that version cannot both commit.
    """

    key_version: Mapped[int] = mapped_column(
        ForeignKey("key_versions.version", ondelete="RESTRICT"), index=True)
    wrapped_key: Mapped[bytes] = mapped_column(LargeBinary(128))
    nonce: Mapped[bytes] = mapped_column(LargeBinary(12))
    ciphertext: Mapped[bytes] = mapped_column(LargeBinary)
    # What seal() sealed, until the row is stored; never a column.
    _sealing: tuple[KeySource, bytes, bytes]

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

    def seal(self, keyring: KeySource, plaintext: bytes, associated_data: bytes) -> None:
        """Seal ``plaintext`` into this row, which is stored later.

        Until then :meth:`seal_again` seals it anew under the current version:
        the one it was sealed under may be retired before the store commits.
        The plaintext stays in memory as long as this (unstored) row does.
        """
        self.envelope = seal(keyring, plaintext, associated_data)
        self._sealing = (keyring, plaintext, associated_data)

    def seal_again(self) -> None:
        """Seal what :meth:`seal` sealed again, under the current key version."""
        keyring, plaintext, associated_data = self._sealing
        self.envelope = seal(keyring, plaintext, associated_data)
