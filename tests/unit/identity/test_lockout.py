"""The login lockout's counter rule, on the database the suite runs against."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, select

from gateway.identity.lockout import ACCOUNT_SCOPE, ADDRESS_SCOPE, LockedOut, Lockout, Reservation
from gateway.identity.models import LoginCounter
from gateway.settings import Secret

START = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
PEPPER = Secret("a-pepper-of-at-least-thirty-two-characters")


@pytest.fixture
def lockout() -> Lockout:
    return Lockout("3 per 15 minutes", PEPPER)


class Attempts:
    """Attempts against one engine, each in a transaction of its own, as logins make them."""

    def __init__(self, engine: Engine, lockout: Lockout) -> None:
        self.engine = engine
        self.lockout = lockout

    def reserve(self, at: datetime, username: str = "alice",
                address: str = "192.0.2.1") -> Reservation | str:
        """The reservation, or the scope that refused it."""
        try:
            return self.lockout.reserve(self.engine.begin, at, username=username,
                                        address=address)
        except LockedOut as refused:
            return refused.scope

    def give_back(self, reservation: Reservation | str) -> None:
        assert isinstance(reservation, Reservation)
        with self.engine.begin() as connection:
            self.lockout.give_back(connection, reservation)

    def counts(self) -> list[int]:
        with self.engine.connect() as connection:
            return sorted(connection.scalars(select(LoginCounter.attempts)).all())


@pytest.fixture
def attempts(engine: Engine, lockout: Lockout) -> Attempts:
    return Attempts(engine, lockout)


def test_the_default_limit_is_ten_per_fifteen_minutes() -> None:
    default = Lockout("10 per 15 minutes", PEPPER)
    assert (default.limit, default.window) == (10, timedelta(minutes=15))


def test_attempts_past_the_limit_are_refused_and_take_no_place(attempts: Attempts) -> None:
    answers = [attempts.reserve(START) for _ in range(5)]
    assert [isinstance(answer, Reservation) for answer in answers] == [True] * 3 + [False] * 2
    assert answers[3:] == [ACCOUNT_SCOPE, ACCOUNT_SCOPE]
    # The refused attempts changed nothing, in either window.
    assert attempts.counts() == [3, 3]


def test_the_window_opens_with_the_first_attempt_and_a_new_one_after_it_ends(
    attempts: Attempts,
) -> None:
    for _ in range(3):
        attempts.reserve(START + timedelta(minutes=5))
    assert attempts.reserve(START + timedelta(minutes=19, seconds=59)) == ACCOUNT_SCOPE
    assert isinstance(attempts.reserve(START + timedelta(minutes=20)), Reservation)
    assert attempts.counts() == [1, 1]


def test_refusal_says_how_long_until_the_window_ends(
    engine: Engine, lockout: Lockout, attempts: Attempts,
) -> None:
    for _ in range(3):
        attempts.reserve(START)
    with pytest.raises(LockedOut) as refused:
        lockout.reserve(engine.begin, START + timedelta(minutes=10), username="alice",
                        address="192.0.2.1")
    assert refused.value.headers() == {"Retry-After": "300"}
    assert refused.value.status == 429


def test_accounts_are_case_folded_and_addresses_counted_apart(attempts: Attempts) -> None:
    for name in ("alice", "Alice", " ALICE "):
        attempts.reserve(START, username=name, address=f"192.0.2.{len(name)}")
    assert attempts.reserve(START, username="alice", address="198.51.100.7") == ACCOUNT_SCOPE
    # One address guessing many accounts is stopped by the address's window.
    for name in ("bob", "carol", "dave"):
        attempts.reserve(START, username=name, address="203.0.113.5")
    assert attempts.reserve(START, username="erin", address="203.0.113.5") == ADDRESS_SCOPE


def test_a_success_gives_its_place_back_in_both_windows(attempts: Attempts) -> None:
    for _ in range(10):
        attempts.give_back(attempts.reserve(START))
    assert attempts.counts() == [0, 0]
    for _ in range(3):
        attempts.reserve(START)
    assert attempts.reserve(START) == ACCOUNT_SCOPE


def test_a_place_is_given_back_only_into_the_window_that_counted_it(
    attempts: Attempts,
) -> None:
    slow = attempts.reserve(START)
    # The window ends while that login's password is checked; a new one opens.
    for _ in range(3):
        attempts.reserve(START + timedelta(minutes=15))
    attempts.give_back(slow)
    assert attempts.counts() == [3, 3]
    assert attempts.reserve(START + timedelta(minutes=16)) == ACCOUNT_SCOPE


def test_counters_hold_digests_not_names_or_addresses(attempts: Attempts) -> None:
    attempts.reserve(START, username="alice", address="192.0.2.1")
    with attempts.engine.connect() as connection:
        keys = connection.scalars(select(LoginCounter.key)).all()
    assert len(keys) == 2
    assert all(len(key) == 64 and "alice" not in key and "192.0.2" not in key for key in keys)


def test_ended_windows_are_forgotten(engine: Engine, lockout: Lockout,
                                     attempts: Attempts) -> None:
    attempts.reserve(START, username="alice", address="192.0.2.1")
    attempts.reserve(START + timedelta(minutes=10), username="bob", address="192.0.2.2")
    with engine.begin() as connection:
        assert lockout.forget_ended(connection, START + timedelta(minutes=15)) == 2
    assert attempts.counts() == [1, 1]
