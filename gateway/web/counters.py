"""The rate limits' counters in this process's memory, for a gateway with no Redis.

A ``limits`` storage (the library's documented way to add one: a
``Storage`` subclass naming its URL scheme), used in place of ``memory://``
when that is configured. The library's own memory storage starts a timer
thread to expire counters whenever its last one has ended: under load a
thread start every few milliseconds, each one holding up a request. Here one
lock guards the counters, a counter past its window reads as zero, and one
long-lived thread per process sweeps expired ones away now and then. The
A/B that keeps it is in bench/HISTORY.md (6 December).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any, Final

from limits.storage import Storage

SCHEME: Final = "gateway-memory"
SWEEP_SECONDS: Final = 5.0


class ProcessCounters(Storage):
    """Fixed-window counters of one process."""

    STORAGE_SCHEME = [SCHEME]  # noqa: RUF012  (the base class declares it so)

    def __init__(self, uri: str | None = None, wrap_exceptions: bool = False,
                 **options: Any) -> None:
        super().__init__(uri, wrap_exceptions=wrap_exceptions, **options)
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._ends: dict[str, float] = {}
        self._sweeping_in = 0  # the process whose sweeper runs (none survives a fork)

    @property
    def base_exceptions(self) -> type[Exception]:
        return RuntimeError  # nothing here fails the way a server does

    def incr(self, key: str, expiry: float, amount: int = 1) -> int:
        """Count ``amount`` in the key's window, starting a new one once it has ended."""
        now = time.time()
        with self._lock:
            if self._ends.get(key, 0.0) <= now:
                self._counts[key] = 0
                self._ends[key] = now + expiry
            count = self._counts[key] = self._counts[key] + amount
        if self._sweeping_in != os.getpid():
            self._start_sweeper()
        return count

    def get(self, key: str) -> int:
        with self._lock:
            return self._counts.get(key, 0) if self._ends.get(key, 0.0) > time.time() else 0

    def get_expiry(self, key: str) -> float:
        with self._lock:
            return self._ends.get(key, time.time())

    def check(self) -> bool:
        return True

    def reset(self) -> int | None:
        with self._lock:
            cleared = len(self._counts)
            self._counts.clear()
            self._ends.clear()
        return cleared

    def clear(self, key: str) -> None:
        with self._lock:
            self._counts.pop(key, None)
            self._ends.pop(key, None)

    def sweep(self) -> None:
        """Forget the counters whose window has ended."""
        now = time.time()
        with self._lock:
            for key in [key for key, end in self._ends.items() if end <= now]:
                del self._counts[key], self._ends[key]

    def _start_sweeper(self) -> None:
        self._sweeping_in = os.getpid()
        threading.Thread(target=_sweep, args=(weakref.ref(self),), name="ratelimit-sweeper",
                         daemon=True).start()


def _sweep(counters: weakref.ref[ProcessCounters]) -> None:
    while True:
        time.sleep(SWEEP_SECONDS)
        alive = counters()
        if alive is None:
            return  # the app and its limiter are gone
        alive.sweep()
        del alive


def storage_uri(configured: str) -> str:
    """The storage to count in: these counters where the settings say ``memory://``."""
    return f"{SCHEME}://" if configured.startswith("memory://") else configured
