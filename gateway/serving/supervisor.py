"""Keeping the ``gateway worker`` that ``gateway serve`` runs alive.

A worker that dies (killed, out of memory, a crash) is started again, after
a wait that doubles with each quick death, so a worker that cannot start
(a database that is down) is retried without spinning. A worker that ran a
while before it died starts again after the shortest wait.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

log = logging.getLogger(__name__)

STOP_SECONDS: Final = 20.0


@dataclass(slots=True)
class Backoff:
    """How long to wait before the next start, given how long the last run lasted."""

    first: float = 1.0
    longest: float = 30.0
    # A run this long was a worker that worked: the next death is a new story.
    steady: float = 60.0
    _next: float = field(default=0.0, init=False, repr=False)

    def after(self, ran_seconds: float) -> float:
        """The wait before starting again, after a run of ``ran_seconds``."""
        if not self._next or ran_seconds >= self.steady:
            self._next = self.first
        wait = self._next
        self._next = min(self._next * 2, self.longest)
        return wait


class Supervisor:
    """Runs ``command`` in a process of its own, starting it again whenever it ends."""

    def __init__(self, command: Sequence[str], *, backoff: Backoff | None = None,
                 spawn: Callable[[Sequence[str]], subprocess.Popen[bytes]] | None = None) -> None:
        self._command = list(command)
        self._backoff = backoff or Backoff()
        self._spawn = spawn or _popen
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name="worker-supervisor", daemon=True)

    @property
    def pid(self) -> int | None:
        """The running worker's process id."""
        with self._lock:
            return self._process.pid if self._process is not None else None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Start no other worker; ask the running one to finish, kill it if it does not."""
        with self._lock:
            self._stop.set()
            process = self._process
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
        self._thread.join(timeout=STOP_SECONDS)

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            process = self._start_one()
            if process is not None:
                # gunicorn's master reaps every child it has: then this wait
                # learns only that the worker ended, not how.
                process.wait()
            if self._stop.is_set():
                return
            ran = time.monotonic() - began
            wait = self._backoff.after(ran)
            if process is not None:
                log.warning("the worker (pid %d) stopped after %.0f s; starting another in "
                            "%.0f s", process.pid, ran, wait, extra={"pid": process.pid})
            self._stop.wait(wait)

    def _start_one(self) -> subprocess.Popen[bytes] | None:
        with self._lock:
            if self._stop.is_set():
                return None
            try:
                process = self._process = self._spawn(self._command)
            except OSError as error:
                log.error("the worker could not be started (%s); trying again",
                          error.strerror or type(error).__name__)
                return None
        log.info("started the worker (pid %d)", process.pid, extra={"pid": process.pid})
        return process


def _popen(command: Sequence[str]) -> subprocess.Popen[bytes]:
    # Its output is the server's: the worker logs to the same stderr.
    # close_fds=False lets subprocess use posix_spawn rather than fork and
    # exec with a pipe to hear of a failed exec: gunicorn forks its workers
    # from this process at any moment, a worker forked meanwhile keeps that
    # pipe open, and Popen would wait on it for ever. Nothing is inherited
    # but what is marked inheritable, and the master holds no listening
    # socket (each worker opens its own, see gunicorn_config).
    return subprocess.Popen(list(command), close_fds=False)
