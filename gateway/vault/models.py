"""Columns of a sealed secret, for any table that stores one."""

from __future__ import annotations

from sqlalchemy import Integer, LargeBinary
from sqlalchemy.orm import Mapped, mapped_column

from gateway.vault.envelope import Envelope


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
