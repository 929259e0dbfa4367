"""When a connection's access token is refreshed before a reveal: within the margin of its
expiry, or within half its lifetime when that is shorter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gateway.credentials.models import Credential
from gateway.oauth.refresh import due

ISSUED = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
MARGIN = timedelta(seconds=60)


def connection(lifetime: float | None, *, refreshed: bool = False) -> Credential:
    expires_at = None if lifetime is None else ISSUED + timedelta(seconds=lifetime)
    return Credential(created_at=ISSUED - timedelta(days=1) if refreshed else ISSUED,
                      refreshed_at=ISSUED if refreshed else None, token_expires_at=expires_at)


@pytest.mark.parametrize(("lifetime", "after", "expected"), [
    (3600, 3539, False),  # more than the margin left
    (3600, 3540, True),  # the margin reached
    (3600, 7200, True),  # expired long ago
    (40, 19, False),  # lives less than the margin: refreshed at half its life...
    (40, 20, True),
    (0, 0, True),  # ...and one that is born expired at once
])
def test_a_token_is_due_within_the_margin_or_half_its_life(
    lifetime: float, after: float, expected: bool,
) -> None:
    now = ISSUED + timedelta(seconds=after)
    assert due(connection(lifetime), now, MARGIN) is expected
    assert due(connection(lifetime, refreshed=True), now, MARGIN) is expected


def test_a_token_without_an_expiry_is_never_due() -> None:
    assert not due(connection(None), ISSUED + timedelta(days=365), MARGIN)


def test_no_margin_refreshes_only_what_has_expired() -> None:
    assert not due(connection(300), ISSUED + timedelta(seconds=299), timedelta(0))
    assert due(connection(300), ISSUED + timedelta(seconds=300), timedelta(0))
