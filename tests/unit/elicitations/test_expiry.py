"""How a link's expiry is worded on its page (UTC; the page's script adds local time)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gateway.elicitations.views import Expiry

pytestmark = pytest.mark.backend_independent

NOW = datetime(2026, 7, 28, 9, 30, 15, tzinfo=UTC)


@pytest.mark.parametrize(("after", "utc", "remaining"), [
    (timedelta(seconds=30), "09:30 UTC", "in less than a minute"),
    (timedelta(minutes=1, seconds=5), "09:31 UTC", "in 1 minute"),
    (timedelta(minutes=15), "09:45 UTC", "in 15 minutes"),
    (timedelta(hours=26), "2026-07-29 11:30 UTC", "in 26 hours"),
    (timedelta(minutes=-5), "09:25 UTC", "in less than a minute"),
])
def test_the_expiry_reads_as_utc_and_time_left(after: timedelta, utc: str,
                                               remaining: str) -> None:
    expiry = Expiry.of(NOW + after, NOW)
    assert (expiry.utc, expiry.remaining) == (utc, remaining)
    assert expiry.iso.endswith("Z")
