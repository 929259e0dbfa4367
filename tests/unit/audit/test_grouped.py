"""Group commit of audit events: each committed before its caller returns; alone on failure."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest
from sqlalchemy import Connection

from gateway.audit.grouped import MAX_BATCH, GroupCommit


class Database:
    """Records each write (one statement), slowly enough for callers to pile up."""

    def __init__(self, refuse: set[int] | None = None) -> None:
        self.statements: list[list[int]] = []
        self.committed: set[int] = set()
        self.lock = threading.Lock()
        self.refuse = refuse or set()
        self.first_write_started = threading.Event()
        self.let_first_write_finish = threading.Event()

    def write(self, connection: Connection, rows: list[dict[str, Any]]) -> None:
        numbers = [row["n"] for row in rows]
        if not self.first_write_started.is_set():
            self.first_write_started.set()
            self.let_first_write_finish.wait(5)
        if self.refuse & set(numbers):
            raise RuntimeError(f"refused {sorted(self.refuse & set(numbers))}")
        with self.lock:
            self.statements.append(numbers)
            self.committed.update(numbers)


def connection(number: int) -> Connection:
    return cast(Connection, f"connection-{number}")


def commit_all(group: GroupCommit, database: Database, count: int) -> dict[int, str]:
    """Commit events 0..count-1 from as many threads while the first write is held."""
    outcomes: dict[int, str] = {}

    def one(number: int) -> None:
        try:
            group.commit(connection(number), {"n": number})
            assert number in database.committed  # committed before it returned
            outcomes[number] = "committed"
        except RuntimeError as error:
            outcomes[number] = str(error)

    with ThreadPoolExecutor(max_workers=count) as pool:
        first = pool.submit(one, 0)
        assert database.first_write_started.wait(5)
        rest = [pool.submit(one, number) for number in range(1, count)]
        while len(group._queue) < count - 1:  # the others queued behind the first write
            threading.Event().wait(0.001)
        database.let_first_write_finish.set()
        for future in [first, *rest]:
            future.result(timeout=10)
    return outcomes


def test_events_arriving_during_a_write_are_committed_together_in_the_next() -> None:
    database = Database()
    outcomes = commit_all(GroupCommit(database.write), database, 10)
    assert outcomes == dict.fromkeys(range(10), "committed")
    assert database.statements == [[0], list(range(1, 10))]


def test_a_batch_holds_at_most_max_batch_events() -> None:
    database = Database()
    count = MAX_BATCH + 6
    outcomes = commit_all(GroupCommit(database.write), database, count)
    assert set(outcomes.values()) == {"committed"}
    assert database.committed == set(range(count))
    assert max(len(statement) for statement in database.statements) == MAX_BATCH


def test_a_failed_batch_fails_only_the_event_that_broke_it() -> None:
    database = Database(refuse={4})
    outcomes = commit_all(GroupCommit(database.write), database, 8)
    assert outcomes.pop(4) == "refused [4]"
    assert outcomes == dict.fromkeys([0, 1, 2, 3, 5, 6, 7], "committed")
    assert 4 not in database.committed
    # After the failed batch, each of its events was written alone.
    assert sorted(database.statements[1:]) == [[1], [2], [3], [5], [6], [7]]


def test_a_failed_event_alone_raises_and_the_next_one_still_commits() -> None:
    database = Database(refuse={0})
    database.let_first_write_finish.set()
    group = GroupCommit(database.write)
    with pytest.raises(RuntimeError, match="refused"):
        group.commit(connection(0), {"n": 0})
    group.commit(connection(1), {"n": 1})
    assert database.statements == [[1]]
