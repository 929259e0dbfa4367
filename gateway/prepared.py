"""Prepared reads: a Core SELECT compiled once per dialect, run on the driver's cursor.

SQLAlchemy's execution path (compiled-cache lookup, parameter building, event
dispatch, result metadata) costs several times more than the statement it
runs when that statement is a primary-key look-up on SQLite, and those
look-ups run on every API request (the token check, the read of an
elicitation or a sealed credential). A :class:`PreparedSelect` keeps what
that path works out each time: the SQL text, the order of its parameters,
and each column's bind and result conversions, taken from SQLAlchemy's own
types, so that a value reads back exactly as through ``Connection.execute``.

Only reads: writes go through SQLAlchemy, whose events queue SQLite's
writers (:mod:`gateway.db`). A driver's error is reported as SQLAlchemy
reports it, and a connection that died is invalidated so that the pool
replaces it.
"""

from __future__ import annotations

import threading
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Select
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, NoResultFound, StatementError
from sqlalchemy.sql.compiler import SQLCompiler

Processor = Callable[[Any], Any] | None


@dataclass(frozen=True, slots=True)
class _Plan:
    """One statement as one dialect runs it."""

    sql: str
    # Parameter names in the order the SQL wants them (positional styles),
    # or None when the driver takes them by name.
    order: tuple[str, ...] | None
    binds: Mapping[str, Processor]
    constants: Mapping[str, Any]
    row: type[tuple[Any, ...]]
    columns: tuple[Any, ...]


class PreparedSelect:
    """A SELECT whose bind parameters all have names (``bindparam("id")``)."""

    def __init__(self, statement: Select[Any]) -> None:
        self._statement = statement
        self._plans: dict[_DialectKey, _Plan] = {}
        # Result conversions depend on the column types the driver reports,
        # known after the first execution on each dialect.
        self._results: dict[_DialectKey, tuple[Processor, ...]] = {}
        self._lock = threading.Lock()

    def first(self, connection: Connection, parameters: Mapping[str, Any]) -> Any:
        """The first row (attributes named as the columns, and ``_asdict``), or None."""
        dialect = connection.dialect
        key = _key(dialect)
        plan = self._plan(key, dialect)
        values = _bound(plan, parameters)
        dbapi_connection = connection.connection.dbapi_connection
        assert dbapi_connection is not None  # a checked-out connection has one
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(plan.sql, values)
            raw = cursor.fetchone()
            description = cursor.description
        except dialect.loaded_dbapi.Error as error:
            raise _reported(connection, plan, error, cursor) from error
        finally:
            cursor.close()
        processors = self._results.get(key) or self._learn(key, dialect, plan, description)
        if raw is None:
            return None
        return plan.row(*(value if process is None or value is None else process(value)
                          for process, value in zip(processors, raw, strict=True)))

    def one(self, connection: Connection, parameters: Mapping[str, Any]) -> Any:
        """The row of a look-up by a unique key, which must find one (else NoResultFound)."""
        row = self.first(connection, parameters)
        if row is None:
            raise NoResultFound("no row was found for a look-up that requires one")
        return row

    def _plan(self, key: _DialectKey, dialect: Dialect) -> _Plan:
        plan = self._plans.get(key)
        if plan is None:
            with self._lock:
                plan = self._plans.setdefault(key, _compile(self._statement, dialect))
        return plan

    def _learn(self, key: _DialectKey, dialect: Dialect, plan: _Plan,
               description: Sequence[Sequence[Any]]) -> tuple[Processor, ...]:
        processors = tuple(
            column.type.dialect_impl(dialect).result_processor(dialect, described[1])
            for column, described in zip(plan.columns, description, strict=True))
        self._results[key] = processors
        return processors


# What the SQL text and the conversions depend on: the database, its driver
# and the driver's parameter style.
_DialectKey = tuple[str, str, str]


def _key(dialect: Dialect) -> _DialectKey:
    return dialect.name, dialect.driver, dialect.paramstyle


def _compile(statement: Select[Any], dialect: Dialect) -> _Plan:
    compiled = statement.compile(dialect=dialect)
    assert isinstance(compiled, SQLCompiler)
    sql = str(compiled)
    if "POSTCOMPILE" in sql:
        raise ValueError("a prepared select cannot hold an expanding IN; use Connection.execute")
    # Keyed by the names the SQL text uses, which for a literal are made up.
    binds: dict[str, Processor] = {
        name: bind.type.dialect_impl(dialect).bind_processor(dialect)
        for name, bind in compiled.binds.items()}
    # Values written into the statement itself (a literal in a WHERE).
    constants = {name: bind.value for name, bind in compiled.binds.items()
                 if bind.value is not None and not bind.required}
    columns = tuple(statement.selected_columns)
    row = namedtuple("Row", [column.key for column in columns])  # type: ignore[misc]
    order = tuple(compiled.positiontup or ()) if compiled.positional else None
    return _Plan(sql, order, binds, constants, row, columns)


def _reported(connection: Connection, plan: _Plan, error: Any, cursor: Any) -> StatementError:
    # As SQLAlchemy reports a driver's error: its own exception class, and a
    # connection that died is invalidated, so the pool replaces it. The
    # parameters stay out of the message (they may be token digests).
    dialect = connection.dialect
    disconnected = dialect.is_disconnect(error, connection.connection.dbapi_connection, cursor)
    if disconnected:
        connection.invalidate(error)
    reported: StatementError = DBAPIError.instance(
        plan.sql, None, error, dialect.loaded_dbapi.Error, hide_parameters=True,
        connection_invalidated=disconnected, dialect=dialect)
    return reported


def _bound(plan: _Plan, parameters: Mapping[str, Any]) -> Any:
    values = {**plan.constants, **parameters}
    for name, process in plan.binds.items():
        if process is not None:
            values[name] = process(values[name])
    if plan.order is None:
        return values
    return tuple(values[name] for name in plan.order)
