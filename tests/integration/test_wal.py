"""The keeper of a SQLite file's write-ahead log: emptied past its size, nothing lost."""

from __future__ import annotations

import gc
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from gateway import db
from gateway.wal import WalKeeper

MIB = 2**20
ROWS = 64


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Path]:
    """A WAL database whose writer never checkpoints, with a log of about 2 MB."""
    path = tmp_path / "kept.db"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("CREATE TABLE things (blob BLOB)")
    for _ in range(ROWS):
        writer.execute("INSERT INTO things VALUES (?)", (os.urandom(32 * 1024),))
    yield path
    writer.close()


def _log_size(database: Path) -> int:
    return Path(f"{database}-wal").stat().st_size


def _rows(database: Path) -> int:
    with sqlite3.connect(database) as reader:
        count: int = reader.execute("SELECT count(*) FROM things").fetchone()[0]
    return count


def test_a_log_past_its_limit_is_emptied_and_nothing_is_lost(database: Path) -> None:
    assert _log_size(database) > 2 * MIB
    assert WalKeeper(str(database), busy_timeout=5, limit=MIB).check() is True
    assert _log_size(database) == 0
    assert _rows(database) == ROWS


def test_a_log_under_its_limit_is_left_alone(database: Path) -> None:
    before = _log_size(database)
    assert WalKeeper(str(database), busy_timeout=5, limit=before + 1).check() is False
    assert _log_size(database) == before


def test_a_reader_in_the_middle_of_its_snapshot_is_waited_for_then_tried_again(
    database: Path,
) -> None:
    keeper = WalKeeper(str(database), busy_timeout=0.1, limit=MIB)
    reader = sqlite3.connect(database, isolation_level=None)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM things").fetchone()[0] == ROWS
    try:
        assert keeper.check() is False  # the reader still needs the log
        assert _log_size(database) > 0
    finally:
        reader.execute("COMMIT")
        reader.close()
    assert keeper.check() is True
    assert _log_size(database) == 0


def _keepers(database: Path) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate()
            if thread.name == f"sqlite-wal-keeper {database}"]


def test_an_engine_on_a_file_runs_one_keeper_which_ends_with_it(tmp_path: Path) -> None:
    path = tmp_path / "engine.db"
    engine = db.make_engine(f"sqlite:///{path}")
    assert _keepers(path) == []  # none before the first connection
    connections = [engine.connect() for _ in range(3)]
    for connection in connections:
        connection.execute(text("SELECT 1"))
        connection.close()
    assert len(_keepers(path)) == 1
    engine.dispose()
    del engine, connections, connection
    gc.collect()
    deadline = time.monotonic() + 5
    while _keepers(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _keepers(path) == []
