"""Scratch databases for tests: a SQLite file, or a fresh PostgreSQL database.

Also the one privileged step the suite needs and the product lacks: emptying
the append-only audit trail between tests.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import make_url


def describe(url: str | None) -> str:
    return "sqlite" if not url else make_url(url).render_as_string(hide_password=True)


@contextmanager
def scratch_database(folder: Path) -> Iterator[str]:
    """Yield the URL of a new, empty database; drop it afterwards."""
    server_url = os.environ.get("TEST_DATABASE_URL")
    if not server_url:
        yield f"sqlite:///{folder / 'gateway.db'}"
        return
    name = f"gateway_test_{secrets.token_hex(6)}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextmanager
def audit_trail_writable(connection: Connection) -> Iterator[None]:
    """Lift the audit trail's append-only triggers inside this connection's transaction.

    As the tables' owner: on PostgreSQL the triggers are disabled, on SQLite
    dropped, and both come back before the transaction commits; if it rolls
    back instead, so does the lifting.
    """
    if connection.dialect.name == "postgresql":
        connection.execute(text("ALTER TABLE audit_events DISABLE TRIGGER USER"))
        yield
        connection.execute(text("ALTER TABLE audit_events ENABLE TRIGGER USER"))
        return
    # pysqlite opens its transaction only before a data change: a DROP TRIGGER
    # sent first would commit on its own. This statement deletes nothing.
    connection.execute(text("DELETE FROM audit_events WHERE 0"))
    triggers = connection.execute(text(
        "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'audit_events'"
    )).all()
    for name, _ in triggers:
        connection.execute(text(f'DROP TRIGGER "{name}"'))
    yield
    for _, sql in triggers:
        connection.execute(text(sql))
