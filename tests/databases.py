"""Scratch databases for tests: a SQLite file, or a fresh PostgreSQL database."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text
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
