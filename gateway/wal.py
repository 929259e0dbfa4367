"""Keeping a SQLite file's write-ahead log from growing without end under steady load.

SQLite checkpoints its log on its own once it holds 1,000 pages, but only
passively: a checkpoint copies what no reader still needs, and the log
starts over from its beginning only at a moment when no reader is using it.
Under steady requests some reader always is, so the log grows for as long
as the load lasts, and every read gets slower as it looks its pages up in
a log that keeps growing (bench/HISTORY.md has the runs).

So every process that opens the file also runs a keeper thread: once a
second it looks at the log's size and, past :data:`CHECKPOINT_BYTES`, runs a
``TRUNCATE`` checkpoint. That one waits for the readers of the moment (a
request's worth of milliseconds) and holds new writers back while it copies
the log into the database, then empties the log: a short pause for the
writers now and then instead of reads that slow down for as long as the
load lasts.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import weakref
from typing import Final

from sqlalchemy import Engine

log = logging.getLogger(__name__)

# Past this size the log is emptied: a few seconds of the heaviest writes.
CHECKPOINT_BYTES: Final = 32 * 1024 * 1024
CHECK_SECONDS: Final = 1.0
# How long a checkpoint waits for the other writers and the readers of the
# moment. Writers are held back while it waits, so never longer than this;
# past it, the next check tries again.
BUSY_SECONDS: Final = 0.5

_STARTED: dict[str, int] = {}
_STARTED_GUARD = threading.Lock()


def keep_small(engine: Engine) -> None:
    """Start this process's keeper of the engine's file, unless one runs already.

    Once per process and file: gunicorn's workers are forked, and a thread
    does not survive the fork. The keeper ends with the engine (a test's, a
    command's), and the next engine on the file starts another.
    """
    database = engine.url.database
    assert database is not None
    with _STARTED_GUARD:
        if _STARTED.get(database) == os.getpid():
            return
        _STARTED[database] = os.getpid()
    keeper = WalKeeper(database, BUSY_SECONDS)
    threading.Thread(target=_keep, args=(keeper, weakref.ref(engine)),
                     name=f"sqlite-wal-keeper {database}", daemon=True).start()


def _keep(keeper: WalKeeper, engine: weakref.ref[Engine]) -> None:
    try:
        while engine() is not None:
            time.sleep(CHECK_SECONDS)
            keeper.check()
    finally:
        with _STARTED_GUARD:
            _STARTED.pop(keeper.database, None)


class WalKeeper:
    """Empties a database's write-ahead log each time it has grown past a size."""

    def __init__(self, database: str, busy_timeout: float, *,
                 limit: int = CHECKPOINT_BYTES) -> None:
        self.database = database
        self._log_path = f"{database}-wal"
        self._busy_timeout = busy_timeout
        self._limit = limit

    def check(self) -> bool:
        """Empty the log if it has grown past the limit; whether it was emptied."""
        try:
            size = os.stat(self._log_path).st_size
        except FileNotFoundError:
            return False
        if size < self._limit:
            return False
        started = time.monotonic()
        # A connection of its own, only for as long as the checkpoint.
        connection = sqlite3.connect(self.database, isolation_level=None,
                                     timeout=self._busy_timeout)
        try:
            busy, _, _ = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error as error:
            log.warning("the write-ahead log of %s was not emptied (%s); trying again",
                        self.database, error)
            return False
        finally:
            connection.close()
        if busy:
            # Another process's checkpoint, or a reader that outlasted
            # BUSY_SECONDS: the next check tries again.
            return False
        log.debug("emptied the write-ahead log of %s (%d MB) in %.0f ms", self.database,
                  size // 2**20, (time.monotonic() - started) * 1000)
        return True
