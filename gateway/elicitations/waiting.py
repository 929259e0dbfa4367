"""Long-polls: holding ``GET …?wait=N`` until the elicitation ends or N passes.

Worker model: gunicorn's gevent workers (:mod:`gateway.serving.server`). A
waiting request is a greenlet parked on an Event; it holds no thread and no
database connection. Each process has one watcher, whatever the number of
waiters: it listens for the database's change signal (:mod:`gateway.changes`,
which crosses instances) and then asks which elicitations ended since it last
looked, by the ``ended_at`` index, so that a check costs what ended lately,
not what is watched. Every :data:`FULL_CHECK_SECONDS` it also asks about every
watched elicitation: a safety net for an instance whose clock is far behind.

A process holds at most ``slots`` waits (``gateway serve --waits``). Past
that, a wait returns at once with the current state and the client simply
asks again. A waiter whose client hangs up is let go at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import Engine, bindparam, select

from gateway import changes
from gateway.clock import Clock
from gateway.db import for_reads
from gateway.elicitations.lifecycle import OPEN
from gateway.elicitations.models import Elicitation

log = logging.getLogger(__name__)

DEFAULT_SLOTS: Final = 64
# Even without a signal, look again this often: a safety net, not the mechanism.
FALLBACK_POLL_SECONDS: Final = 2.0
# How often every watched elicitation is checked, whatever ``ended_at`` says.
FULL_CHECK_SECONDS: Final = 30.0
# At most this many checks a second however busy the database is.
MIN_CHECK_INTERVAL: Final = 0.05
# How far before the last check a lately-ended elicitation is looked for: the
# time from an ending's timestamp to its commit, and the clocks of instances
# that disagree by less than this.
LOOK_BACK: Final = timedelta(seconds=10)
_BATCH: Final = 500

_ENDED_SINCE: Final = select(Elicitation.id).where(
    Elicitation.ended_at >= bindparam("since"))
_ENDED_AMONG: Final = select(Elicitation.id).where(
    Elicitation.id.in_(bindparam("ids", expanding=True)),
    Elicitation.status.not_in([status.value for status in OPEN]))

# Stops watching a client's connection.
StopWatching = Callable[[], None]


class WaitHub:
    """One process's waiters and the watcher that wakes them."""

    def __init__(self, engine: Engine, clock: Clock, slots: int = DEFAULT_SLOTS) -> None:
        self._engine = engine
        self._clock = clock
        self._reader = for_reads(engine)  # made once: it runs at every wake-up
        self._slots = threading.BoundedSemaphore(max(1, slots))
        self._lock = threading.Lock()
        self._waiters: defaultdict[str, set[threading.Event]] = defaultdict(set)
        self._has_waiters = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    def wait(self, elicitation_id: str, timeout: float, connection: int | None = None) -> bool:
        """Block until the elicitation may have ended, ``timeout`` passes, or the client leaves.

        ``connection`` is the client's socket (its file descriptor), watched
        for a hang-up where the server can (a gevent worker). Returns False at
        once when every waiting slot is taken. The caller reads the
        elicitation again afterwards either way.
        """
        if timeout <= 0 or not self._slots.acquire(blocking=False):
            return False
        event = threading.Event()
        stop_watching = _on_hangup(connection, event.set)
        try:
            with self._lock:
                self._waiters[elicitation_id].add(event)
                self._ensure_thread()
                self._has_waiters.notify()
            event.wait(timeout)
            return True
        finally:
            stop_watching()
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
            since = self._clock.now() - LOOK_BACK
            full_check_due = time.monotonic() + FULL_CHECK_SECONDS
            while True:
                with self._lock:
                    while not self._waiters:
                        self._has_waiters.wait()
                changed = listener.wait(FALLBACK_POLL_SECONDS)
                checked_at = self._clock.now()
                if time.monotonic() >= full_check_due:
                    self._wake(self._ended_among_watched())
                    full_check_due = time.monotonic() + FULL_CHECK_SECONDS
                elif changed:
                    self._wake(self._ended_since(since))
                since = checked_at - LOOK_BACK
                time.sleep(MIN_CHECK_INTERVAL)
        finally:
            listener.close()

    def _ended_since(self, since: datetime) -> list[str]:
        with self._reader.connect() as connection:
            return list(connection.scalars(_ENDED_SINCE, {"since": since}))

    def _ended_among_watched(self) -> list[str]:
        with self._lock:
            watched = list(self._waiters)
        ended: list[str] = []
        with self._reader.connect() as connection:
            for start in range(0, len(watched), _BATCH):
                ended += connection.scalars(_ENDED_AMONG,
                                            {"ids": watched[start:start + _BATCH]})
        return ended

    def _wake(self, ended: Iterable[str]) -> None:
        with self._lock:
            for elicitation_id in ended:
                for event in self._waiters.get(elicitation_id, ()):
                    event.set()


def _on_hangup(connection: int | None, callback: Callable[[], None]) -> StopWatching:
    """Call ``callback`` when the client's connection becomes readable, under gevent.

    A client that sent its request and waits for the answer sends nothing
    more: a connection that becomes readable was closed (or the client spoke
    out of turn), and either way the wait may end now. Under threads there
    is no loop to watch it on, and the wait simply runs its course.
    """
    hub = _gevent_hub()
    if connection is None or hub is None:
        return _nothing
    watcher = hub.loop.io(connection, 1)  # 1: readable
    watcher.start(callback)
    return watcher.close  # type: ignore[no-any-return]


def _gevent_hub() -> Any:
    # gevent is the server's worker model; in a process it has not patched
    # (the tests' threads, the CLI) there is no hub to watch on.
    try:
        from gevent import get_hub, monkey
    except ImportError:
        return None
    return get_hub() if monkey.is_module_patched("threading") else None


def _nothing() -> None:
    return None
