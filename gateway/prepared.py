"""Prepared statements: a Core statement compiled once per dialect, run on the driver's cursor.

SQLAlchemy's execution path (compiled-cache lookup, parameter building, event
dispatch, result metadata) costs several times more than the statement it
runs when that statement is a primary-key look-up or a one-row write on
SQLite, and those run on every API request and every submit. A prepared
statement keeps what that path works out each time: the SQL text, the order
of its parameters, and each column's bind and result conversions, taken from
SQLAlchemy's own types, so that a value is written and read back exactly as
through ``Connection.execute``.

- :class:`PreparedSelect` reads rows.
- :class:`PreparedWrite` runs an INSERT, UPDATE or DELETE (with RETURNING or
  not). It runs the engine's ``before_cursor_execute`` and
  ``after_cursor_execute`` listeners around the statement, as SQLAlchemy
  does, so SQLite's writer queue (:mod:`gateway.db`) sees every write.
  On a SQLite write transaction the queue's lock is held from the first write
  to the commit, so the less Python runs in between, the sooner the next
  writer goes: this is the other reason writes are prepared.
- :class:`PreparedInserts` adds one row to each of several tables in one
  statement: a change that commits on its own, without a transaction.

A driver's error is reported as SQLAlchemy reports it, and a connection that
died is invalidated so that the pool replaces it.
"""

from __future__ import annotations

import threading
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import (
    Column,
    Connection,
    Delete,
    Insert,
    MetaData,
    Select,
    Table,
    Update,
    bindparam,
    insert,
    literal_column,
    null,
    select,
)
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


Statement = Select[Any] | Insert | Update | Delete


class _Prepared:
    """A statement whose bind parameters all have names (``bindparam("id")``)."""

    def __init__(self, statement: Statement) -> None:
        self._statement = statement
        self._plans: dict[_DialectKey, _Plan] = {}
        # Result conversions depend on the column types the driver reports,
        # known after the first execution on each dialect.
        self._results: dict[_DialectKey, tuple[Processor, ...]] = {}
        self._lock = threading.Lock()

    def _plan(self, key: _DialectKey, dialect: Dialect) -> _Plan:
        plan = self._plans.get(key)
        if plan is None:
            with self._lock:
                plan = self._plans.setdefault(
                    key, _compile(self._statement_for(dialect), dialect))
        return plan

    def _statement_for(self, dialect: Dialect) -> Statement:
        return self._statement

    def _execute(self, connection: Connection, parameters: Mapping[str, Any], *,
                 limit: int | None, listened: bool) -> tuple[list[Any], int]:
        """Run the statement on the driver's cursor: its rows (up to ``limit``), its rowcount.

        ``listened``: run the engine's ``before_cursor_execute`` and
        ``after_cursor_execute`` listeners around it, as SQLAlchemy does.
        """
        dialect = connection.dialect
        key = _key(dialect)
        plan = self._plan(key, dialect)
        values = _bound(plan, parameters)
        cursor = _cursor(connection)
        dispatch = connection.dispatch
        try:
            if listened:
                dispatch.before_cursor_execute(connection, cursor, plan.sql, values, None, False)
            cursor.execute(plan.sql, values)
            raw = [] if not plan.columns else (
                cursor.fetchall() if limit is None else cursor.fetchmany(limit))
            processors = self._results.get(key)
            if processors is None and raw:
                # Read once per dialect: psycopg builds the description
                # afresh on each access, a column object per column.
                processors = self._learn(key, dialect, plan, cursor.description)
            rowcount = cursor.rowcount
            if listened:
                dispatch.after_cursor_execute(connection, cursor, plan.sql, values, None, False)
        except dialect.loaded_dbapi.Error as error:
            raise _reported(connection, plan, error, cursor) from error
        finally:
            cursor.close()
        return _rows(plan, raw, processors), rowcount

    def _learn(self, key: _DialectKey, dialect: Dialect, plan: _Plan,
               description: Sequence[Sequence[Any]]) -> tuple[Processor, ...]:
        processors = tuple(
            column.type.dialect_impl(dialect).result_processor(dialect, described[1])
            for column, described in zip(plan.columns, description, strict=True))
        self._results[key] = processors
        return processors


class PreparedSelect(_Prepared):
    """A SELECT whose bind parameters all have names (``bindparam("id")``)."""

    def __init__(self, statement: Select[Any]) -> None:
        super().__init__(statement)

    def first(self, connection: Connection, parameters: Mapping[str, Any]) -> Any:
        """The first row (attributes named as the columns, and ``_asdict``), or None."""
        rows, _ = self._execute(connection, parameters, limit=1, listened=False)
        return rows[0] if rows else None

    def one(self, connection: Connection, parameters: Mapping[str, Any]) -> Any:
        """The row of a look-up by a unique key, which must find one (else NoResultFound)."""
        row = self.first(connection, parameters)
        if row is None:
            raise NoResultFound("no row was found for a look-up that requires one")
        return row


@dataclass(frozen=True, slots=True)
class Written:
    """What a write did: the rows it matched, and what its RETURNING clause gave."""

    rowcount: int
    rows: list[Any]


class PreparedWrite(_Prepared):
    """An INSERT, UPDATE or DELETE whose bind parameters all have names.

    An INSERT names its columns: ``insert(table).values({name: bindparam(name,
    type_=column.type)})`` (see :func:`insert_into`); a column's Python-side
    default is not applied here, so every column without a server default
    gets a value.
    """

    def __init__(self, statement: Insert | Update | Delete) -> None:
        super().__init__(statement)

    def run(self, connection: Connection, parameters: Mapping[str, Any]) -> Written:
        """Run the write in ``connection``'s transaction (or on its own, in autocommit)."""
        # With the engine's listeners: SQLite's writer queue takes its turn
        # before the write and, on an autocommit connection, gives it back after.
        rows, rowcount = self._execute(connection, parameters, limit=None, listened=True)
        return Written(rowcount, rows)


class PreparedInserts(_Prepared):
    """One row into each of several tables in one statement: on autocommit, one change.

    For a change that only adds rows (an elicitation and its audit event):
    as one statement on an autocommit connection it commits as it runs,
    every row or none, with no BEGIN and no COMMIT. On PostgreSQL that is
    one round trip instead of four; on SQLite the write lock is held inside
    that one call of the driver only, never while the thread waits for the
    interpreter lock between a transaction's statements (see SQLite's
    writers' queue in :mod:`gateway.db`), which is what made concurrent
    creates queue on it.

    PostgreSQL chains the INSERTs with WITH. SQLite writes one table per
    statement, so there the statement inserts one row into a temporary view
    whose ``INSTEAD OF`` trigger inserts each table's row; the view and the
    trigger are made on each connection before its first use.

    ``name`` names that view: one per statement. Parameters are given per
    table: ``run(connection, {"elicitations": {...}, "audit_events": {...}})``,
    each row with every column but a generated key.
    """

    def __init__(self, name: str, *tables: Table) -> None:
        if len(tables) < 2:
            raise ValueError("PreparedInserts writes several tables; use PreparedWrite for one")
        self._name = name
        self._tables = tables
        # The statement's parameter for each table's column.
        self._parameters = {table.name: {column.key: _joined(table, column)
                                         for column in _inserted(table)} for table in tables}
        self._view = Table(name, MetaData(), *(
            Column(_joined(table, column), column.type)
            for table in tables for column in _inserted(table)))
        super().__init__(_chained(tables))

    def run(self, connection: Connection, rows: Mapping[str, Mapping[str, Any]]) -> None:
        """Insert each table's row (``rows`` keyed by table name), all in one statement."""
        parameters = {self._parameters[table][name]: value
                      for table, row in rows.items() for name, value in row.items()}
        if connection.dialect.name == "sqlite":
            self._install(connection)
        self._execute(connection, parameters, limit=None, listened=True)

    def _statement_for(self, dialect: Dialect) -> Statement:
        return insert_into(self._view) if dialect.name == "sqlite" else self._statement

    def _install(self, connection: Connection) -> None:
        # Temporary objects live as long as the connection: made once on each.
        installed: set[str] = connection.connection.info.setdefault(_INSTALLED, set())
        if self._name in installed:
            return
        cursor = _cursor(connection)
        try:
            for sql in self._sqlite_definitions(connection.dialect):
                cursor.execute(sql)
        finally:
            cursor.close()
        installed.add(self._name)

    def _sqlite_definitions(self, dialect: Dialect) -> tuple[str, str]:
        quote = dialect.identifier_preparer.quote
        view = quote(self._name)
        # Identifiers only, all the gateway's own: no value is written into the SQL.
        columns = select(*(null().label(column.key) for column in self._view.columns))
        inserts = "; ".join(
            str(insert(table).values({
                column.key: literal_column(f"NEW.{quote(_joined(table, column))}")
                for column in _inserted(table)}).inline().compile(dialect=dialect))
            for table in self._tables)
        return (
            f"CREATE TEMP VIEW IF NOT EXISTS {view} AS {columns.compile(dialect=dialect)}",
            f"CREATE TEMP TRIGGER IF NOT EXISTS {quote(self._name + '_insert')} "
            f"INSTEAD OF INSERT ON {view} BEGIN {inserts}; END",
        )


_INSTALLED: Final = "gateway.prepared_inserts"


def _inserted(table: Table) -> list[Column[Any]]:
    """The columns an INSERT gives values: all but a generated key."""
    return [column for column in table.columns if column is not table.autoincrement_column]


def _joined(table: Table, column: Column[Any]) -> str:
    return f"{table.name}__{column.key}"


def _chained(tables: Sequence[Table]) -> Insert:
    """``WITH a AS (INSERT INTO a …), b AS (INSERT INTO b …) INSERT INTO c …`` (PostgreSQL)."""

    def values(table: Table) -> Insert:
        return insert(table).values({
            column.key: bindparam(_joined(table, column), type_=column.type)
            for column in _inserted(table)})

    *first, last = tables
    statement = values(last)
    for table in first:
        statement = statement.add_cte(values(table).cte(f"{table.name}_inserted"))
    return statement


def _rows(plan: _Plan, raw: list[Any], processors: tuple[Processor, ...] | None) -> list[Any]:
    """The fetched rows as named tuples, each value converted as SQLAlchemy converts it."""
    if not raw or processors is None:
        return []
    return [plan.row(*(value if process is None or value is None else process(value)
                       for process, value in zip(processors, values, strict=True)))
            for values in raw]


def insert_into(table: Table, columns: Sequence[str] | None = None) -> Insert:
    """An INSERT of ``columns`` (default: all but a generated key), each bound by its name."""
    chosen = [table.c[name] for name in columns] if columns is not None else _inserted(table)
    return insert(table).values({
        column.key: bindparam(column.key, type_=column.type) for column in chosen})


def _cursor(connection: Connection) -> Any:
    dbapi_connection = connection.connection.dbapi_connection
    assert dbapi_connection is not None  # a checked-out connection has one
    return dbapi_connection.cursor()


# What the SQL text and the conversions depend on: the database, its driver
# and the driver's parameter style.
_DialectKey = tuple[str, str, str]


def _key(dialect: Dialect) -> _DialectKey:
    return dialect.name, dialect.driver, dialect.paramstyle


def _compile(statement: Statement, dialect: Dialect) -> _Plan:
    compiled = statement.compile(dialect=dialect)
    assert isinstance(compiled, SQLCompiler)
    sql = str(compiled)
    if "POSTCOMPILE" in sql:
        raise ValueError("a prepared statement cannot hold an expanding IN; use "
                         "Connection.execute")
    # Keyed by the names the SQL text uses, which for a literal are made up.
    binds: dict[str, Processor] = {
        name: bind.type.dialect_impl(dialect).bind_processor(dialect)
        for name, bind in compiled.binds.items()}
    # Values written into the statement itself (a literal in a WHERE, a
    # None in an UPDATE's SET).
    constants = {name: bind.value for name, bind in compiled.binds.items()
                 if not bind.required}
    # A SELECT's columns, or what a write's RETURNING gives (none without one).
    columns = tuple(statement.exported_columns)
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
    if missing := plan.binds.keys() - values.keys():
        # Checked before anything is sent, and every missing name told.
        raise KeyError(f"no value for the parameters {', '.join(sorted(missing))}")
    for name, process in plan.binds.items():
        if process is not None:
            values[name] = process(values[name])
    if plan.order is None:
        return values
    return tuple(values[name] for name in plan.order)
