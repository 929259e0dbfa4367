"""The one check of a provider's token answer, for the code exchange and the refresh alike:
every field typed, ``expires_in`` cut to 0 to ten years, bearer tokens only (RFC 6749
sections 5.1 and 7.1); and a throttling provider's Retry-After, passed on up to a cap."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gateway.oauth.provider import (
    MAX_EXPIRES_IN,
    MAX_RETRY_AFTER,
    UnusableAnswer,
    retry_after_seconds,
    token_answer,
    token_expiry,
)

GOOD: dict[str, Any] = {"access_token": "at-1", "token_type": "Bearer", "expires_in": 300,
                        "refresh_token": "rt-1", "scope": "openid repo", "id_token": "a.b.c"}
NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def test_a_good_answer_keeps_the_fields_the_gateway_uses() -> None:
    assert token_answer({**GOOD, "x_vendor": {"nested": True}}) == GOOD


@pytest.mark.parametrize("token_type", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_bearer_in_any_case_is_stored_as_bearer(token_type: str) -> None:
    assert token_answer({**GOOD, "token_type": token_type})["token_type"] == "Bearer"


@pytest.mark.parametrize(("given", "seconds"), [
    (300, 300), (300.7, 300), ("3600", 3600), (0, 0), (-5, 0),
    (10**12, MAX_EXPIRES_IN), (float("inf"), MAX_EXPIRES_IN)])
def test_expires_in_is_whole_seconds_between_zero_and_ten_years(given: object,
                                                                 seconds: int) -> None:
    answer = token_answer({**GOOD, "expires_in": given})
    assert answer["expires_in"] == seconds
    # The expiry can be computed: 10**12 seconds overflowed a datetime.
    assert token_expiry(answer, NOW) == NOW + timedelta(seconds=seconds)
    assert MAX_EXPIRES_IN == 10 * 365 * 24 * 3600


def test_absent_optional_fields_are_left_out() -> None:
    answer = token_answer({"access_token": "at-1", "token_type": "bearer", "refresh_token": ""})
    assert answer == {"access_token": "at-1", "token_type": "Bearer"}
    assert token_expiry(answer, NOW) is None


def test_a_scope_list_becomes_a_scope_string() -> None:
    assert token_answer({**GOOD, "scope": ["openid", "repo"]})["scope"] == "openid repo"


@pytest.mark.parametrize(("change", "words"), [
    ({"access_token": None}, "it came without an access_token"),
    ({"access_token": ""}, "it came without an access_token"),
    ({"access_token": 12345}, "its access_token is not a string"),
    ({"access_token": "line\nbreak"}, "its access_token is not a string"),
    ({"token_type": None}, "it has no token_type"),
    ({"token_type": "DPoP " + "x" * 2000}, "its token_type is not Bearer"),
    ({"token_type": "mac"}, "its token_type is not Bearer"),
    ({"token_type": ["Bearer"]}, "its token_type is not Bearer"),
    ({"expires_in": "soon"}, "its expires_in is not a number"),
    ({"expires_in": True}, "its expires_in is not a number"),
    ({"expires_in": float("nan")}, "its expires_in is not a number"),
    ({"expires_in": {"seconds": 3}}, "its expires_in is not a number"),
    ({"refresh_token": ["rt"]}, "its refresh_token is not a string"),
    ({"scope": 5}, "its scope is not a string of scope names"),
    ({"scope": ["openid", 5]}, "its scope is not a string of scope names"),
    ({"id_token": 5}, "its id_token is not a string"),
    ({"error": "invalid_grant"}, "it carries an error with a success status"),
])
def test_a_bad_field_makes_the_answer_unusable_and_the_message_names_it(
    change: dict[str, Any], words: str,
) -> None:
    with pytest.raises(UnusableAnswer) as refused:
        token_answer({**GOOD, **change})
    assert str(refused.value).startswith(words)
    assert "xxxx" not in str(refused.value)  # the provider's value is never echoed


@pytest.mark.parametrize("document", [None, [], "token", 5])
def test_an_answer_that_is_not_a_json_object_is_unusable(document: object) -> None:
    with pytest.raises(UnusableAnswer, match="not a JSON object"):
        token_answer(document)


@pytest.mark.parametrize(("header", "seconds"), [
    (None, None), ("", None), ("soon", None), ("120", 120), ("0", 1), ("86400", MAX_RETRY_AFTER),
    ("Mon, 07 Dec 2026 12:01:00 GMT", 60), ("Mon, 07 Dec 2026 11:00:00 GMT", 1),
    ("Wed, 21 Oct 2099 07:28:00 GMT", MAX_RETRY_AFTER)])
def test_retry_after_is_the_providers_within_one_second_and_the_cap(
    header: str | None, seconds: int | None,
) -> None:
    assert retry_after_seconds(header, NOW) == seconds
