"""The database's clock: one time for every instance that shares the database.

A lease taken by one instance and judged by another must be read on one
clock; each machine's own may be seconds apart. ``database_now(seconds)`` is
the database's current time plus ``seconds``, usable in any statement on
SQLite and PostgreSQL, typed like the columns it is compared with and
stored in (:class:`gateway.db.UTCDateTime`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Float, literal
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from gateway.db import UTCDateTime


class database_now(FunctionElement[datetime]):
    """The database's current time plus ``seconds``, in UTC."""

    type = UTCDateTime()
    name = "database_now"
    inherit_cache = True

    def __init__(self, seconds: float = 0.0) -> None:
        super().__init__(literal(float(seconds), Float()))


@compiles(database_now)
def _standard(element: database_now, compiler: SQLCompiler, **kw: Any) -> str:
    # PostgreSQL: the transaction's start, as a timestamptz.
    seconds = compiler.process(element.clauses, **kw)
    return f"(CURRENT_TIMESTAMP + ({seconds}) * INTERVAL '1 second')"


@compiles(database_now, "sqlite")
def _sqlite(element: database_now, compiler: SQLCompiler, **kw: Any) -> str:
    # SQLite keeps these columns as text, 'YYYY-MM-DD HH:MM:SS.ffffff' in
    # UTC, and compares them as text: the same shape (milliseconds, padded
    # to six digits) keeps the comparison right and the value readable.
    seconds = compiler.process(element.clauses, **kw)
    return f"strftime('%Y-%m-%d %H:%M:%f000', 'now', printf('%+.3f seconds', {seconds}))"
