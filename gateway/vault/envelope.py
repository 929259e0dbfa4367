"""Envelope encryption: a fresh data key per secret, wrapped by a versioned key.

Each secret gets its own random 256-bit data key and is sealed with
AES-256-GCM under a random 96-bit nonce. The associated data binds the
ciphertext to its row (say credential id, client, subject, type): copied onto
another row, it no longer opens. The data key is itself sealed with AES-GCM
under the newest key-encryption key (see :mod:`gateway.vault.versions`),
bound to the same row and to the key version, so rotation only rewraps 60
bytes per row.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gateway.vault.keyring import KeyringError, KeySource

NONCE_BYTES: Final = 12
DATA_KEY_BITS: Final = 256


class VaultError(Exception):
    """A sealed secret could not be opened: tampered, moved, or its key is gone."""


@dataclass(frozen=True, slots=True)
class Envelope:
    """What is stored for one secret; nothing in it is readable without the keyring."""

    key_version: int
    wrapped_key: bytes = field(repr=False)  # wrap nonce + sealed data key
    nonce: bytes = field(repr=False)
    ciphertext: bytes = field(repr=False)  # includes the GCM tag


def bind(**fields: str) -> bytes:
    """Canonical associated data for a row: the same fields always give the same bytes."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def seal(keyring: KeySource, plaintext: bytes, associated_data: bytes) -> Envelope:
    """Encrypt ``plaintext`` for the row that ``associated_data`` describes."""
    data_key = AESGCM.generate_key(bit_length=DATA_KEY_BITS)
    nonce = os.urandom(NONCE_BYTES)
    ciphertext = AESGCM(data_key).encrypt(nonce, plaintext, associated_data)
    version = keyring.current_version
    return Envelope(version, _wrap(keyring, version, data_key, associated_data), nonce,
                    ciphertext)


def reveal_plaintext(keyring: KeySource, envelope: Envelope, associated_data: bytes) -> bytes:
    """Decrypt; any change to the envelope or to the row it belongs to fails closed."""
    data_key = _unwrap(keyring, envelope, associated_data)
    try:
        return AESGCM(data_key).decrypt(envelope.nonce, envelope.ciphertext, associated_data)
    except (InvalidTag, ValueError):
        raise VaultError("the secret does not open: altered, or not stored for this row") \
            from None


def rewrap(keyring: KeySource, envelope: Envelope, associated_data: bytes) -> Envelope:
    """The same secret with its data key wrapped by the newest key version."""
    version = keyring.current_version
    if envelope.key_version == version:
        return envelope
    data_key = _unwrap(keyring, envelope, associated_data)
    return Envelope(version, _wrap(keyring, version, data_key, associated_data),
                    envelope.nonce, envelope.ciphertext)


def _wrap_context(version: int, associated_data: bytes) -> bytes:
    return b"gateway data key v%d|" % version + associated_data


def _wrap(keyring: KeySource, version: int, data_key: bytes, associated_data: bytes) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    sealed = AESGCM(keyring.key(version)).encrypt(
        nonce, data_key, _wrap_context(version, associated_data))
    return nonce + sealed


def _unwrap(keyring: KeySource, envelope: Envelope, associated_data: bytes) -> bytes:
    try:
        kek = keyring.key(envelope.key_version)
    except KeyringError as error:
        raise VaultError(str(error)) from None
    nonce, sealed = envelope.wrapped_key[:NONCE_BYTES], envelope.wrapped_key[NONCE_BYTES:]
    try:
        return AESGCM(kek).decrypt(
            nonce, sealed, _wrap_context(envelope.key_version, associated_data))
    except (InvalidTag, ValueError):
        raise VaultError("the data key does not unwrap: altered, or not stored for this row") \
            from None
