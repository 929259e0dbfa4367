"""The in-process counters of the API's rate limits: fixed windows, counted exactly."""

from __future__ import annotations

import threading
import time

import pytest
from limits import parse
from limits.strategies import FixedWindowRateLimiter

from gateway.web.ratelimit import SteadyMemoryStorage


@pytest.fixture
def storage() -> SteadyMemoryStorage:
    return SteadyMemoryStorage()


def test_hits_count_up_within_a_window(storage: SteadyMemoryStorage) -> None:
    before = time.time()
    assert [storage.incr("k", 60) for _ in range(3)] == [1, 2, 3]
    assert storage.get("k") == 3
    # The window ends a minute after its first hit, not after the last.
    assert before + 60 <= storage.get_expiry("k") <= time.time() + 60


def test_a_new_window_starts_from_zero(storage: SteadyMemoryStorage,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    storage.incr("k", 60)
    storage.incr("k", 60)
    later = time.time() + 61
    monkeypatch.setattr(time, "time", lambda: later)
    assert storage.incr("k", 60) == 1
    assert storage.get_expiry("k") == later + 60


def test_keys_count_apart(storage: SteadyMemoryStorage) -> None:
    storage.incr("a", 60)
    assert storage.incr("b", 60) == 1


def test_threads_lose_no_hit(storage: SteadyMemoryStorage) -> None:
    def hit() -> None:
        for _ in range(2000):
            storage.incr("k", 60)

    threads = [threading.Thread(target=hit) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert storage.get("k") == 16000


def test_the_fixed_window_strategy_refuses_past_the_limit(storage: SteadyMemoryStorage) -> None:
    strategy = FixedWindowRateLimiter(storage)
    rate = parse("3/minute")
    assert [strategy.hit(rate, "client") for _ in range(4)] == [True, True, True, False]
    _, remaining = strategy.get_window_stats(rate, "client")
    assert remaining == 0
