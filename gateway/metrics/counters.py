"""Figures only a process sees, counted where they happen (prometheus-client counters).

A refused request leaves no row behind (counting 429s in the database would
mean writing one per refusal, under exactly the load being refused), so
rate-limit hits are counted in memory. gunicorn serves with several worker
processes and a scrape reaches only one of them: ``gateway serve`` therefore
runs prometheus-client's multiprocess mode, where each process writes its
counters to a file in a folder made for this server run, and ``/metrics``
adds up every process's file. Without that folder (tests, a lone process) the
counter is read from memory.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from flask import Flask
    from prometheus_client import Counter

# prometheus-client's own switch: set, every counter lives in a file in this folder.
MULTIPROCESS_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
# Followed by the server's process id, so a later server can tell an abandoned folder.
FOLDER_PREFIX: Final = "gateway-metrics-"
EXTENSION: Final = "gateway.counters"


@dataclass(frozen=True)
class Counters:
    """The app's in-process counters; ``/metrics`` reads each (or its files)."""

    rate_limit_hits: Counter
    rate_limit_storage_errors: Counter
    oauth_callbacks_refused: Counter

    def all(self) -> tuple[Counter, ...]:
        return (self.rate_limit_hits, self.rate_limit_storage_errors,
                self.oauth_callbacks_refused)


def init_app(app: Flask) -> Counters:
    """Make the app's counters; call before anything that counts."""
    # Imported here, not above: `gateway serve` imports this module before it
    # sets the folder, and prometheus-client must not be loaded by then.
    from prometheus_client import Counter

    # Not registered anywhere: /metrics reads them (or their files) explicitly.
    made = Counters(
        rate_limit_hits=Counter(
            "gateway_rate_limit_hits", "Requests refused by a rate limit, by limit",
            ["limit"], registry=None),
        rate_limit_storage_errors=Counter(
            "gateway_rate_limit_storage_errors",
            "Requests the rate limits could not count: their storage was unreachable",
            registry=None),
        oauth_callbacks_refused=Counter(
            "gateway_oauth_callbacks_refused",
            "Returns from an OAuth provider refused before any state was looked at, by reason",
            ["reason"], registry=None),
    )
    app.extensions[EXTENSION] = made
    return made


def of(app: Flask) -> Counters:
    """The counters :func:`init_app` made for ``app``."""
    made: Counters = app.extensions[EXTENSION]
    return made


def multiprocess_folder() -> Path | None:
    """Where this server's processes keep their counters, when they share them."""
    folder = os.environ.get(MULTIPROCESS_ENV)
    return Path(folder) if folder else None


@contextmanager
def shared_between_processes() -> Iterator[Path]:
    """A fresh counters folder for the processes this one is about to start.

    prometheus-client reads the variable once, when it is first imported, so
    it must be set before that happens; the server imports the app only in
    its worker processes, after this.
    """
    if "prometheus_client" in sys.modules and not os.environ.get(MULTIPROCESS_ENV):
        raise RuntimeError("prometheus_client was imported before the counters folder was "
                           "set; each process would count on its own")
    owner = os.getpid()
    _remove_abandoned_folders()
    folder = tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{owner}-")
    os.environ[MULTIPROCESS_ENV] = folder
    try:
        yield Path(folder)
    finally:
        # gunicorn's worker processes are forks that leave through this block
        # too; only the server that made the folder removes it.
        if os.getpid() == owner:
            os.environ.pop(MULTIPROCESS_ENV, None)
            shutil.rmtree(folder, ignore_errors=True)


def _remove_abandoned_folders() -> None:
    # A server that was killed (SIGKILL, a crash) could not remove its folder;
    # the next one to start does, once that server's process is gone.
    for folder in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*-*"):
        pid = folder.name.removeprefix(FOLDER_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True
