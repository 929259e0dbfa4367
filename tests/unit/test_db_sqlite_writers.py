"""SQLite writers of one process queue on a lock instead of SQLite's busy handler.

Its own SQLite file in a temporary folder, whatever TEST_DATABASE_URL says.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Column, Connection, Engine, Integer, MetaData, Table, text
from sqlalchemy.exc import OperationalError

from gateway import db
from gateway.prepared import PreparedWrite, insert_into

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


@pytest.fixture
def one_cpu() -> Iterator[None]:
    """This process on one CPU, as a pinned worker of `gateway serve` is."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("CPU affinity is Linux's")
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    yield
    os.sched_setaffinity(0, cpus)


@pytest.fixture
def several_cpus() -> None:
    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs a process that may run on two CPUs or more")


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


@pytest.mark.parametrize("cpus", ["one_cpu", "as_started"])
def test_autocommit_writes_beside_write_transactions_all_commit(
    engine: Engine, autocommit_engine: Engine, cpus: str, request: pytest.FixtureRequest,
) -> None:
    # Autocommit writes meet the queued transactions in SQLite's busy
    # handler, or on one CPU queue with them: never refused.
    if cpus == "one_cpu":
        request.getfixturevalue("one_cpu")
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


@pytest.mark.usefixtures("one_cpu")
def test_an_autocommit_write_on_one_cpu_waits_for_its_turn_in_the_queue(
    engine: Engine, autocommit_engine: Engine,
) -> None:
    # Not in SQLite's busy handler, where a writer that arrives later may go
    # first, again and again (see db._serialize_sqlite_writers).
    thread_lock, _ = db._writer_locks(engine.url.database)
    done = threading.Event()

    def write() -> None:
        with autocommit_engine.connect() as connection:
            connection.execute(text("INSERT INTO rows (n) VALUES (1)"))
        done.set()

    with thread_lock:  # a writer of this process holds the queue
        thread = threading.Thread(target=write)
        thread.start()
        time.sleep(0.2)
        assert not done.is_set()
    assert done.wait(5)
    thread.join()
    assert _count(engine) == 1


def _queue_is_free(engine: Engine) -> bool:
    """Whether another thread gets the writers' queue at once."""
    thread_lock, file_lock = db._writer_locks(engine.url.database)
    assert file_lock is not None
    got: list[bool] = []

    def take() -> None:
        if thread_lock.acquire(timeout=1):
            got.append(file_lock.acquire(time.monotonic() + 1))
            file_lock.release()
            thread_lock.release()

    thread = threading.Thread(target=take)
    thread.start()
    thread.join()
    return got == [True]


_ROWS = Table("rows", MetaData(), Column("n", Integer))
_MISSING = Table("missing", MetaData(), Column("n", Integer))


@pytest.mark.usefixtures("several_cpus")
def test_an_autocommit_write_on_several_cpus_does_not_wait_for_the_queue(
    engine: Engine, autocommit_engine: Engine,
) -> None:
    # Its turn would pass on only once its thread had the interpreter lock
    # back, and threads on other CPUs hold it longer: slower, measured.
    thread_lock, _ = db._writer_locks(engine.url.database)
    with thread_lock:  # a writer of this process holds the queue
        started = time.monotonic()
        with autocommit_engine.connect() as connection:
            connection.execute(text("INSERT INTO rows (n) VALUES (1)"))
        assert time.monotonic() - started < 1
    assert _count(engine) == 1


@pytest.mark.usefixtures("one_cpu")
@pytest.mark.parametrize(("statement", "fails"), [
    (lambda c: c.execute(text("INSERT INTO rows (n) VALUES (1)")), False),
    (lambda c: c.execute(text("INSERT INTO missing (n) VALUES (1)")), True),
    (lambda c: PreparedWrite(insert_into(_ROWS)).run(c, {"n": 1}), False),
    (lambda c: PreparedWrite(insert_into(_MISSING)).run(c, {"n": 1}), True),
], ids=["statement", "failed statement", "prepared", "failed prepared"])
def test_an_autocommit_write_on_one_cpu_gives_its_turn_back_when_its_statement_ends(
    engine: Engine, autocommit_engine: Engine,
    statement: Callable[[Connection], object], fails: bool,
) -> None:
    # Its connection is still checked out: the turn ends with the statement,
    # whether it succeeded or failed, not when the request gives it back.
    with autocommit_engine.connect() as connection:
        if fails:
            with pytest.raises(OperationalError, match="no such table"):
                statement(connection)
        else:
            statement(connection)
        assert _queue_is_free(engine)
    assert _count(engine) == (0 if fails else 1)


def test_a_transaction_keeps_its_turn_until_it_ends(engine: Engine) -> None:
    with engine.connect() as connection:
        connection.execute(text("INSERT INTO rows (n) VALUES (1)"))
        assert not _queue_is_free(engine)
        connection.commit()
    assert _queue_is_free(engine)


@pytest.mark.parametrize("second_on", ["engine", "autocommit_engine"])
def test_a_writer_waits_until_the_other_transaction_has_ended(
    engine: Engine, second_on: str, request: pytest.FixtureRequest,
) -> None:
    # Every engine on the file waits for an open write transaction: another
    # transaction in the writers' queue, an autocommit write there too on one
    # CPU, else in SQLite's busy handler.
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
