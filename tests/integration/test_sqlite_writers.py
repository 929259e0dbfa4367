"""SQLite writers of several processes: each waits its turn, sleeping between tries."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from gateway.db import unit_of_work
from gateway.sqlite import make_engine


def hold_the_write_lock(path: Path, seconds: float) -> threading.Event:
    """Another process's writer, as SQLite sees it: a connection of its own in BEGIN IMMEDIATE."""
    taken = threading.Event()

    def writer() -> None:
        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")
        taken.set()
        time.sleep(seconds)
        other.execute("COMMIT")
        other.close()
    threading.Thread(target=writer, daemon=True).start()
    assert taken.wait(5)
    return taken


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "writers.db"
    engine = make_engine(f"sqlite:///{path}")
    with unit_of_work(engine) as session:
        session.execute(text("CREATE TABLE rows (n INTEGER)"))
    engine.dispose()
    return path


def test_a_writer_waits_for_another_process_and_then_writes(database: Path) -> None:
    engine = make_engine(f"sqlite:///{database}")
    hold_the_write_lock(database, 0.4)
    started = time.monotonic()
    with unit_of_work(engine) as session:
        session.execute(text("INSERT INTO rows VALUES (1)"))
    waited = time.monotonic() - started
    assert 0.3 < waited < 3
    with engine.connect() as connection:
        assert connection.scalar(text("SELECT count(*) FROM rows")) == 1
    engine.dispose()


def test_a_writer_that_may_not_wait_is_refused_at_once(database: Path) -> None:
    engine = make_engine(f"sqlite:///{database}")
    hold_the_write_lock(database, 1.0)
    started = time.monotonic()
    with pytest.raises(OperationalError, match="locked"), \
            unit_of_work(engine, wait=False) as session:
        session.execute(text("INSERT INTO rows VALUES (1)"))
    assert time.monotonic() - started < 0.5
    engine.dispose()


def test_the_wait_sleeps_so_the_rest_of_the_process_runs(database: Path) -> None:
    # The wait is Python's sleep, not SQLite's busy handler inside the
    # driver's call: under gevent the worker's other requests run meanwhile.
    engine = make_engine(f"sqlite:///{database}")
    slept: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        real_sleep(seconds)
    hold_the_write_lock(database, 0.3)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "sleep", sleep)
        with unit_of_work(engine) as session:
            session.execute(text("INSERT INTO rows VALUES (2)"))
    assert slept, "the writer waited inside SQLite instead of sleeping between tries"
    engine.dispose()
