"""Pooled connections: a PostgreSQL connection that died while idle is replaced, unseen."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, text

from gateway import db


@pytest.fixture
def postgres_engine(database_url: str) -> Iterator[Engine]:
    if not database_url.startswith("postgresql"):
        pytest.skip("a SQLite file has no server to lose the connection")
    engine = db.make_engine(database_url, pool_size=1, max_overflow=0)
    yield engine
    engine.dispose()


def _backend_pid(engine: Engine) -> int:
    with engine.connect() as connection:
        pid: int = connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
    return pid


def _terminate(database_url: str, pid: int) -> None:
    admin = create_engine(database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    admin.dispose()


def test_a_connection_killed_while_idle_is_replaced_before_use(
    postgres_engine: Engine, database_url: str,
) -> None:
    first = _backend_pid(postgres_engine)
    _terminate(database_url, first)
    second = _backend_pid(postgres_engine)
    assert second != first
