"""Long-polls: holding ``GET …?wait=N`` until the elicitation ends or N passes.

Worker model: gunicorn's threaded workers. A waiting request parks one
thread on an Event and holds no database connection. Each process has one
watcher thread, whatever the number of waiters: it listens for the
database's change signal (:mod:`gateway.changes`, which crosses instances)
and then asks, in one query, which of the watched elicitations have ended.

So that waiters cannot starve other requests, a process lends at most
``slots`` threads to waiting (``gateway serve`` sets it to its thread count
minus a reserve). Past that, a wait returns at once with the current state
and the client simply asks again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Final

from sqlalchemy import Engine, select

from gateway import changes
from gateway.db import for_reads
from gateway.elicitations.lifecycle import OPEN
from gateway.elicitations.models import Elicitation

log = logging.getLogger(__name__)

DEFAULT_SLOTS: Final = 64
# Even without a signal, look again this often: a safety net, not the mechanism.
FALLBACK_POLL_SECONDS: Final = 2.0
# At most this many checks a second however busy the database is.
MIN_CHECK_INTERVAL: Final = 0.05
_BATCH: Final = 500


class WaitHub:
    """One process's waiters and the thread that wakes them."""

    def __init__(self, engine: Engine, slots: int = DEFAULT_SLOTS) -> None:
        self._engine = engine
        self._reader = for_reads(engine)  # made once: it runs at every wake-up
        self._slots = threading.BoundedSemaphore(max(1, slots))
        self._lock = threading.Lock()
        self._waiters: defaultdict[str, set[threading.Event]] = defaultdict(set)
        self._has_waiters = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    def wait(self, elicitation_id: str, timeout: float) -> bool:
        """Block until the elicitation may have ended or ``timeout`` passes.

        Returns False at once when every waiting slot is taken. The caller
        reads the elicitation again afterwards either way.
        """
        if timeout <= 0 or not self._slots.acquire(blocking=False):
            return False
        event = threading.Event()
        try:
            with self._lock:
                self._waiters[elicitation_id].add(event)
                self._ensure_thread()
                self._has_waiters.notify()
            event.wait(timeout)
            return True
        finally:
            with self._lock:
                events = self._waiters.get(elicitation_id)
                if events is not None:
                    events.discard(event)
                    if not events:
                        del self._waiters[elicitation_id]
            self._slots.release()

    def _ensure_thread(self) -> None:
        # Started on first use, so it starts in the worker process (after
        # gunicorn forks), never in the master.
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="gateway-waits", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self._watch()
            except Exception:
                log.exception("long-poll watcher failed; restarting in 1 s")
                time.sleep(1)

    def _watch(self) -> None:
        listener = changes.open_listener(self._engine)
        try:
            while True:
                with self._lock:
                    while not self._waiters:
                        self._has_waiters.wait()
                listener.wait(FALLBACK_POLL_SECONDS)
                self._wake_ended()
                time.sleep(MIN_CHECK_INTERVAL)
        finally:
            listener.close()

    def _wake_ended(self) -> None:
        with self._lock:
            watched = list(self._waiters)
        ended: list[str] = []
        with self._reader.connect() as connection:
            for start in range(0, len(watched), _BATCH):
                batch = watched[start:start + _BATCH]
                ended += connection.scalars(select(Elicitation.id).where(
                    Elicitation.id.in_(batch),
                    Elicitation.status.not_in([s.value for s in OPEN]),
                )).all()
        with self._lock:
            for elicitation_id in ended:
                for event in self._waiters.get(elicitation_id, ()):
                    event.set()
