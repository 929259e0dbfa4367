"""Alembic migrations, run by ``gateway db upgrade`` and checked by ``/readyz``.

Alembic is configured here in code, so an installed wheel needs no alembic.ini.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

HERE = Path(__file__).parent


def _base_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(HERE))
    return config


def alembic_config(engine: Engine) -> Config:
    """An Alembic config bound to the engine."""
    config = _base_config()
    config.attributes["engine"] = engine
    return config


@cache
def _script_directory() -> ScriptDirectory:
    return ScriptDirectory.from_config(_base_config())


def head_revisions() -> set[str]:
    """The revisions the code expects the database to be at."""
    return set(_script_directory().get_heads())


def current_revisions(engine: Engine) -> set[str]:
    """The revisions the database is at (empty for a new database)."""
    with engine.connect() as connection:
        return set(MigrationContext.configure(connection).get_current_heads())


def is_current(engine: Engine) -> bool:
    """Whether the database is at the code's head revisions."""
    return current_revisions(engine) == head_revisions()


def upgrade(engine: Engine, revision: str = "heads") -> None:
    """Migrate the database up to ``revision``."""
    command.upgrade(alembic_config(engine), revision)
