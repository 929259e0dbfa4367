"""The SQLite database and its journal files are readable by their owner only."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from sqlalchemy import text

from gateway import db

pytestmark = pytest.mark.backend_independent


def test_a_new_database_and_its_wal_files_are_owner_only(tmp_path: Path) -> None:
    engine = db.make_engine(f"sqlite:///{tmp_path / 'gateway.db'}")
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE t (x INTEGER)"))
        connection.execute(text("INSERT INTO t VALUES (1)"))
        files = sorted(path.name for path in tmp_path.glob("gateway.db*")
                       if not path.name.endswith(".lock"))
        modes = {name: stat.S_IMODE((tmp_path / name).stat().st_mode) for name in files}
    engine.dispose()
    assert files == ["gateway.db", "gateway.db-shm", "gateway.db-wal"]
    assert modes == dict.fromkeys(files, 0o600)


def test_an_existing_database_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    path.touch(mode=0o640)
    path.chmod(0o640)
    db.make_engine(f"sqlite:///{path}").dispose()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
