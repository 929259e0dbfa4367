"""Alembic environment: runs online against the engine handed in by the caller."""

from __future__ import annotations

from alembic import context

import gateway.models  # noqa: F401  (registers every table on Base.metadata)
from gateway.db import Base

engine = context.config.attributes["engine"]

with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()
