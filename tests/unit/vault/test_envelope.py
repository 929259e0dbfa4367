"""Envelope encryption round-trips, and fails closed on any change."""

from __future__ import annotations

import dataclasses
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.vault.envelope import Envelope, VaultError, bind, reveal_plaintext, rewrap, seal
from gateway.vault.keyring import Keyring

KEYRING = Keyring({1: os.urandom(32)})
ROW = bind(credential_id="cred_1", client_id="cli_1", subject="https://idp|alice",
           type="openai")


@given(st.binary(max_size=4096))
def test_what_is_sealed_opens_again(plaintext: bytes) -> None:
    assert reveal_plaintext(KEYRING, seal(KEYRING, plaintext, ROW), ROW) == plaintext


def flip(data: bytes, bit: int) -> bytes:
    index = bit % (len(data) * 8)
    changed = bytearray(data)
    changed[index // 8] ^= 1 << (index % 8)
    return bytes(changed)


@settings(max_examples=200)
@given(st.binary(min_size=1, max_size=64),
       st.sampled_from(["wrapped_key", "nonce", "ciphertext"]),
       st.integers(min_value=0))
def test_flipping_any_bit_fails_closed(plaintext: bytes, part: str, bit: int) -> None:
    envelope = seal(KEYRING, plaintext, ROW)
    tampered = dataclasses.replace(envelope, **{part: flip(getattr(envelope, part), bit)})
    with pytest.raises(VaultError):
        reveal_plaintext(KEYRING, tampered, ROW)


@pytest.mark.parametrize("field", ["credential_id", "client_id", "subject", "type"])
def test_a_ciphertext_moved_to_another_row_fails_closed(field: str) -> None:
    fields = {"credential_id": "cred_1", "client_id": "cli_1",
              "subject": "https://idp|alice", "type": "openai"}
    envelope = seal(KEYRING, b"sk-secret", bind(**fields))
    other_row = bind(**{**fields, field: fields[field] + "x"})
    with pytest.raises(VaultError):
        reveal_plaintext(KEYRING, envelope, other_row)


def test_ten_thousand_encryptions_use_ten_thousand_nonces() -> None:
    envelopes = [seal(KEYRING, b"k", ROW) for _ in range(10_000)]
    assert len({e.nonce for e in envelopes}) == 10_000
    assert len({e.wrapped_key[:12] for e in envelopes}) == 10_000


def test_rewrap_moves_to_the_newest_version_and_keeps_the_secret() -> None:
    old = Keyring({1: KEYRING.key(1)})
    envelope = seal(old, b"sk-secret", ROW)
    rotated = Keyring({1: KEYRING.key(1), 2: os.urandom(32)})
    moved = rewrap(rotated, envelope, ROW)
    assert moved.key_version == 2
    assert moved.ciphertext == envelope.ciphertext
    retired = Keyring({2: rotated.key(2)})
    assert reveal_plaintext(retired, moved, ROW) == b"sk-secret"
    with pytest.raises(VaultError, match="v1 is not in the keyring"):
        reveal_plaintext(retired, envelope, ROW)


def test_a_wrong_key_fails_closed() -> None:
    envelope = seal(KEYRING, b"sk-secret", ROW)
    with pytest.raises(VaultError):
        reveal_plaintext(Keyring({1: os.urandom(32)}), envelope, ROW)


def test_envelopes_print_no_bytes() -> None:
    envelope = seal(KEYRING, b"sk-secret", ROW)
    assert repr(envelope) == "Envelope(key_version=1)"
    assert isinstance(envelope, Envelope)
    assert "v1" in repr(KEYRING)
    assert repr(KEYRING.key(1)) not in repr(KEYRING)
