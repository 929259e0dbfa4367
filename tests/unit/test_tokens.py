"""Tokens: enough randomness, and stored digests that need the pepper."""

from __future__ import annotations

import base64

import pytest

from gateway.settings import Secret
from gateway.tokens import keyed_digest, new_id, new_token, token_hint

pytestmark = pytest.mark.backend_independent


def test_tokens_carry_at_least_256_random_bits_url_safe() -> None:
    token = new_token("gw_")
    body = token.removeprefix("gw_")
    assert len(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))) >= 32
    assert all(ch.isalnum() or ch in "-_" for ch in body)
    assert len({new_token("gw_") for _ in range(100)}) == 100


def test_digests_depend_on_the_pepper_and_hide_the_token() -> None:
    token = new_token("gw_")
    one, two = Secret("a" * 40), Secret("b" * 40)
    assert keyed_digest(one, token) == keyed_digest(one, token)
    assert keyed_digest(one, token) != keyed_digest(two, token)
    assert token not in keyed_digest(one, token)
    assert len(keyed_digest(one, token)) == 64


def test_hints_show_only_the_start() -> None:
    token = "gw_AbCdEfGhIjKl"
    assert token_hint(token) == "gw_AbCd…"


def test_ids_are_random() -> None:
    assert len({new_id("el_", 18) for _ in range(100)}) == 100
    assert len(new_id("el_", 18)) == 3 + 24
