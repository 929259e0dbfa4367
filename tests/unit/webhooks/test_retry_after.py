"""Retry-After as the receiver writes it: seconds, an HTTP date, or anything at all."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gateway.webhooks.dispatcher import MAX_RETRY_AFTER, SCHEDULE, _retry_after

pytestmark = pytest.mark.backend_independent

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def test_the_cap_is_the_schedules_longest_wait() -> None:
    assert max(SCHEDULE) == MAX_RETRY_AFTER


@pytest.mark.parametrize(("value", "wait"), [
    ("120", timedelta(seconds=120)),
    (" 120 ", timedelta(seconds=120)),
    ("0", timedelta(0)),
    ("99999999999999999999", MAX_RETRY_AFTER),
    ("9" * 5000, MAX_RETRY_AFTER),
    ("Mon, 01 Jun 2026 12:05:00 GMT", timedelta(minutes=5)),
    ("Mon, 01 Jun 2026 11:00:00 GMT", timedelta(0)),
    ("Fri, 31 Dec 9999 23:59:59 GMT", MAX_RETRY_AFTER),
    ("Mon, 01 Jun 2026 12:05:00 -0000", None),  # no zone: not an HTTP date
    ("Mon, 99 Jun 2026 12:05:00 GMT", None),
    ("\u00b2", None),
    ("-1", None),
    ("1.5", None),
    ("soon", None),
    ("", None),
    (None, None),
])
def test_retry_after_is_a_bounded_wait_or_none(value: str | None,
                                               wait: timedelta | None) -> None:
    assert _retry_after(value, NOW) == wait
