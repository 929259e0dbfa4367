"""SQLite writers of one process queue on a lock instead of SQLite's busy handler.

Its own SQLite file in a temporary folder, whatever TEST_DATABASE_URL says.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from gateway import db

# Its own SQLite file: the same on every run, whichever backend the suite is on.
pytestmark = pytest.mark.backend_independent


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = db.make_engine(f"sqlite:///{tmp_path / 'writers.db'}")
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE rows (n INTEGER)"))
    yield engine
    engine.dispose()


@pytest.fixture
def autocommit_engine(engine: Engine) -> Iterator[Engine]:
    other = db.make_engine(str(engine.url), isolation_level="AUTOCOMMIT")
    yield other
    other.dispose()


def _transactions(engine: Engine, start: int, failures: list[BaseException]) -> None:
    """50 write transactions of two statements each; a failure is kept for the test to report."""
    try:
        for n in range(start, start + 50):
            with engine.begin() as connection:
                connection.execute(text("INSERT INTO rows (n) VALUES (:n)"), {"n": n})
                connection.execute(text("UPDATE rows SET n = n WHERE n = :n"), {"n": n})
    except BaseException as error:  # reported by the caller's assertion
        failures.append(error)


def _run_together(threads: list[threading.Thread]) -> None:
    """Start every thread, then wait for each to end."""
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_concurrent_write_transactions_all_commit(engine: Engine) -> None:
    failures: list[BaseException] = []
    threads = [threading.Thread(target=_transactions, args=(engine, i * 1000, failures))
               for i in range(8)]
    _run_together(threads)
    assert failures == []
    assert _count(engine) == 400


def test_autocommit_writes_beside_write_transactions_all_commit(
    engine: Engine, autocommit_engine: Engine,
) -> None:
    # Autocommit writes meet the queued transactions in SQLite's busy
    # handler: slower under contention, never refused.
    failures: list[BaseException] = []

    def statements(start: int) -> None:
        try:
            with autocommit_engine.connect() as connection:
                for n in range(start, start + 50):
                    connection.execute(text("INSERT INTO rows (n) VALUES (:n)"), {"n": n})
        except BaseException as error:  # reported by the assertion below
            failures.append(error)

    threads = [threading.Thread(target=_transactions, args=(engine, i * 1000, failures))
               if i % 2 else threading.Thread(target=statements, args=(i * 1000,))
               for i in range(8)]
    _run_together(threads)
    assert failures == []
    assert _count(engine) == 400


def test_an_autocommit_write_does_not_wait_for_the_writers_queue(
    engine: Engine, autocommit_engine: Engine,
) -> None:
    # Queued, its thread would give the queue back only once it had the
    # interpreter lock again after the statement, and every writer would
    # wait for that (see db._serialize_sqlite_writers).
    thread_lock, _ = db._writer_locks(engine.url.database)
    with thread_lock:  # a writer of this process holds the queue
        started = time.monotonic()
        with autocommit_engine.connect() as connection:
            connection.execute(text("INSERT INTO rows (n) VALUES (1)"))
        assert time.monotonic() - started < 1
    assert _count(engine) == 1


@pytest.mark.parametrize("second_on", ["engine", "autocommit_engine"])
def test_a_writer_waits_until_the_other_transaction_has_ended(
    engine: Engine, second_on: str, request: pytest.FixtureRequest,
) -> None:
    # Every engine on the file waits for an open write transaction: another
    # transaction in the writers' queue, an autocommit write (which does not
    # queue) in SQLite's busy handler.
    second_engine: Engine = request.getfixturevalue(second_on)
    done = threading.Event()

    def second_writer() -> None:
        with second_engine.begin() as connection:
            connection.execute(text("INSERT INTO rows (n) VALUES (2)"))
        done.set()

    with engine.connect() as first:
        first.execute(text("INSERT INTO rows (n) VALUES (1)"))
        thread = threading.Thread(target=second_writer)
        thread.start()
        time.sleep(0.2)
        assert not done.is_set()  # queued behind the open write transaction
        first.commit()
    assert done.wait(5)
    thread.join()
    assert _count(engine) == 2


def test_reads_do_not_wait_for_a_writer(engine: Engine) -> None:
    with engine.connect() as writer:
        writer.execute(text("INSERT INTO rows (n) VALUES (1)"))
        read: list[int] = []
        thread = threading.Thread(target=lambda: read.append(_count(engine)))
        thread.start()
        thread.join(5)
        assert read == [0]  # the uncommitted row is not seen, and nothing blocked
        writer.rollback()


def _count(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.scalar(text("SELECT count(*) FROM rows")) or 0)


def test_an_autocommit_write_lets_the_next_writer_go_at_once(
    engine: Engine, autocommit_engine: Engine,
) -> None:
    with autocommit_engine.connect() as connection:
        connection.execute(text("INSERT INTO rows (n) VALUES (1)"))
        # Still checked out, but its write committed as it ran: a transaction
        # on the main engine does not wait for this connection to go back.
        started = time.monotonic()
        with engine.begin() as other:
            other.execute(text("INSERT INTO rows (n) VALUES (2)"))
        assert time.monotonic() - started < 1
    assert _count(engine) == 2
