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
  ``after_cursor_execute`` listeners around the statement, and its
  ``handle_error`` listeners when it fails, as SQLAlchemy does, so SQLite's
  writers' queue (:mod:`gateway.db`) sees every write begin and end.
  On a SQLite write transaction the queue's lock is held from the first write
  to the commit, so the less Python runs in between, the sooner the next
  writer goes: this is the other reason writes are prepared.
- :class:`PreparedChange` changes several tables in one statement, written
  once per database: a change that commits on its own, without a
  transaction. :class:`PreparedInserts` is the change that adds one row to
  each of several tables.

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
    ColumnElement,
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
    not_,
    null,
    select,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.engine.base import ExceptionContextImpl
from sqlalchemy.exc import DBAPIError, IntegrityError, NoResultFound, StatementError
from sqlalchemy.sql.compiler import SQLCompiler

Processor = Callable[[Any], Any] | None


@dataclass(frozen=True, slots=True)
class _Plan:
    """One statement as one dialect runs it."""

    sql: str
    # Parameter names in the order the SQL wants them (positional styles),
    # or None when the driver takes them by name.
    order: tuple[str, ...] | None
    # Opens a cursor on the driver's connection that takes this SQL.
    cursor: Callable[[Any], Any]
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
        cursor = plan.cursor(_driver_connection(connection))
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
            disconnected = dialect.is_disconnect(
                error, connection.connection.dbapi_connection, cursor)
            if listened:
                _tell_failed(connection, plan, values, cursor, error, disconnected)
            raise _reported(connection, plan, error, disconnected) from error
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


class PreparedChange(_Prepared):
    """A change of several tables as one statement, written once for each database.

    As one statement on an autocommit connection it commits as it runs,
    every row or none, with no BEGIN and no COMMIT. On PostgreSQL that is one
    round trip instead of one per table and two more; on SQLite the write
    lock is held inside that one call of the driver only, never while the
    thread waits for the interpreter lock between a transaction's statements
    (see SQLite's writers' queue in :mod:`gateway.db`), which is what made
    concurrent writers queue on it.

    - PostgreSQL runs ``postgresql(parameters)``: a chain of data-modifying
      statements joined with WITH.
    - SQLite changes one table per statement, so there the parameters go in
      as one row of a temporary view whose ``INSTEAD OF`` trigger runs
      ``sqlite(parameters)``, statement after statement; the view and the
      trigger are made on each connection before its first use.

    Both builders get the same :class:`Parameters`: ``parameters["name"]``
    is a bound parameter on PostgreSQL and the view's row (``NEW.name``) in
    the trigger. ``name`` names the view: one per change.

    A change may be guarded, made only if the database is as its caller
    read it (an elicitation still open). The PostgreSQL statement then
    selects a row only when the guard passed, and the SQLite trigger starts
    with :func:`refuse_unless`; :meth:`run` answers False for a refused
    change, which wrote nothing.
    """

    def __init__(self, name: str, parameters: Sequence[Column[Any]], *,
                 postgresql: Callable[[Parameters], Statement],
                 sqlite: Callable[[Parameters], Sequence[Any]]) -> None:
        self._name = name
        self._view = Table(name, MetaData(), *(Column(column.key, column.type)
                                                for column in parameters))
        self._sqlite = sqlite
        super().__init__(postgresql(Parameters(self._view, trigger=False)))

    def run(self, connection: Connection, parameters: Mapping[str, Any]) -> bool:
        """Make the change; False if its guard refused it, and then nothing was written."""
        if connection.dialect.name != "sqlite":
            rows, _ = self._execute(connection, parameters, limit=None, listened=True)
            return bool(rows) or not self._plan(_key(connection.dialect),
                                                connection.dialect).columns
        self._install(connection)
        try:
            self._execute(connection, parameters, limit=None, listened=True)
        except IntegrityError as error:
            if str(error.orig) == _REFUSED:
                return False
            raise
        return True

    def _statement_for(self, dialect: Dialect) -> Statement:
        return insert_into(self._view) if dialect.name == "sqlite" else self._statement

    def _install(self, connection: Connection) -> None:
        # Temporary objects live as long as the connection: made once on each.
        installed: set[str] = connection.connection.info.setdefault(_INSTALLED, set())
        if self._name in installed:
            return
        cursor = _driver_connection(connection).cursor()
        try:
            for sql in self._sqlite_definitions(connection.dialect):
                cursor.execute(sql)
        finally:
            cursor.close()
        installed.add(self._name)

    def _sqlite_definitions(self, dialect: Dialect) -> tuple[str, str]:
        quote = dialect.identifier_preparer.quote
        view = quote(self._name)
        columns = select(*(null().label(column.key) for column in self._view.columns))
        # The gateway's own identifiers and constants only: no value a
        # request brings is written into the SQL.
        body = "; ".join(
            str(statement.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
            for statement in self._sqlite(Parameters(self._view, trigger=True)))
        return (
            f"CREATE TEMP VIEW IF NOT EXISTS {view} AS {columns.compile(dialect=dialect)}",
            f"CREATE TEMP TRIGGER IF NOT EXISTS {quote(self._name + '_insert')} "
            f"INSTEAD OF INSERT ON {view} BEGIN {body}; END",
        )


class Parameters:
    """A change's parameters by name, as its statement refers to them (see PreparedChange)."""

    def __init__(self, view: Table, *, trigger: bool) -> None:
        self._view = view
        self._trigger = trigger

    def __getitem__(self, name: str) -> ColumnElement[Any]:
        column = self._view.c[name]
        if self._trigger:
            return literal_column(f"NEW.{column.key}", type_=column.type)
        return bindparam(column.key, type_=column.type)

    def row(self, table: Table, prefix: str,
            **given: ColumnElement[Any]) -> dict[str, ColumnElement[Any]]:
        """A row of ``table`` from the parameters named ``<prefix>__<column>``, but ``given``."""
        return {column.key: given[column.key] if column.key in given
                else self[f"{prefix}__{column.key}"] for column in _inserted(table)}


class PreparedInserts(PreparedChange):
    """One row into each of several tables in one change (see PreparedChange).

    For a change that only adds rows (an elicitation and its audit event).
    Parameters are given per table: ``run(connection, {"elicitations":
    {...}, "audit_events": {...}})``, each row with every column but a
    generated key.
    """

    def __init__(self, name: str, *tables: Table) -> None:
        if len(tables) < 2:
            raise ValueError("PreparedInserts writes several tables; use PreparedWrite for one")
        self._tables = tables
        super().__init__(name, row_parameters(*tables), postgresql=self._chained,
                         sqlite=self._each)

    def run(self, connection: Connection,  # type: ignore[override]
            rows: Mapping[str, Mapping[str, Any]]) -> None:
        """Insert each table's row (``rows`` keyed by table name), all in one statement."""
        super().run(connection, prefixed(rows))

    def _chained(self, parameters: Parameters) -> Insert:
        """``WITH a AS (INSERT INTO a …), b AS (INSERT INTO b …) INSERT INTO c …``."""
        *first, last = self._tables
        statement = insert(last).values(parameters.row(last, last.name))
        for table in first:
            statement = statement.add_cte(
                insert(table).values(parameters.row(table, table.name)).cte(
                    f"{table.name}_inserted"))
        return statement

    def _each(self, parameters: Parameters) -> list[Insert]:
        return [insert(table).values(parameters.row(table, table.name)).inline()
                for table in self._tables]


def row_parameters(*tables: Table, prefixes: Sequence[str] | None = None) -> list[Column[Any]]:
    """A parameter ``<prefix>__<column>`` for each inserted column of each table.

    The prefix is the table's name unless ``prefixes`` names one per table.
    """
    return [Column(f"{prefix}__{column.key}", column.type)
            for table, prefix in zip(tables, prefixes or [t.name for t in tables], strict=True)
            for column in _inserted(table)]


def prefixed(rows: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Rows keyed by prefix as one change's parameters (see :func:`row_parameters`)."""
    return {f"{prefix}__{name}": value for prefix, row in rows.items()
            for name, value in row.items()}


def refuse_unless(condition: ColumnElement[bool]) -> Select[Any]:
    """A guarded change's first statement in its SQLite trigger: stop unless ``condition``."""
    return select(literal_column(f"RAISE(ABORT, '{_REFUSED}')")).where(not_(condition))


_INSTALLED: Final = "gateway.prepared_changes"
# The message of a guard's refusal on SQLite: constant, so that it is told
# from any other constraint's.
_REFUSED: Final = "gateway: the change was refused by its guard"


def _inserted(table: Table) -> list[Column[Any]]:
    """The columns an INSERT gives values: all but a generated key."""
    return [column for column in table.columns if column is not table.autoincrement_column]


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


def _driver_connection(connection: Connection) -> Any:
    dbapi_connection = connection.connection.dbapi_connection
    assert dbapi_connection is not None  # a checked-out connection has one
    return dbapi_connection


def _driver_cursor(dbapi_connection: Any) -> Any:
    return dbapi_connection.cursor()


def _native_placeholders(dialect: Dialect) -> tuple[Dialect, Callable[[Any], Any]]:
    """The dialect that writes the SQL text, and the cursor that runs it.

    psycopg turns ``%(name)s`` placeholders into PostgreSQL's own ``$1``,
    ``$2`` on every execution, and keeps the result only for statements
    under 4 KiB with at most 50 parameters: a key capture, larger on both
    counts, was parsed afresh each time, a fifth of the time its request
    held the interpreter lock. Its ``RawCursor`` takes ``$n`` as written.
    """
    if dialect.name != "postgresql" or dialect.driver != "psycopg":
        return dialect, _driver_cursor
    from psycopg import RawCursor

    same_dialect: Any = type(dialect)
    return same_dialect(paramstyle="numeric_dollar"), RawCursor


# What the SQL text and the conversions depend on: the database, its driver
# and the driver's parameter style.
_DialectKey = tuple[str, str, str]


def _key(dialect: Dialect) -> _DialectKey:
    return dialect.name, dialect.driver, dialect.paramstyle


def _compile(statement: Statement, dialect: Dialect) -> _Plan:
    writer, cursor = _native_placeholders(dialect)
    compiled = statement.compile(dialect=writer)
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
    return _Plan(sql, order, cursor, binds, constants, row, columns)


def _tell_failed(connection: Connection, plan: _Plan, values: Any, cursor: Any, error: Any,
                 disconnected: bool) -> None:
    # The engine's handle_error listeners hear of the failure as SQLAlchemy
    # tells them (on the dialect's dispatch), before the connection may be
    # invalidated; SQLite's writers' queue then ends an autocommit write's
    # turn. A listener's answer (another exception) is not used: the driver's
    # error is reported as _reported says.
    context = ExceptionContextImpl(error, None, connection.engine, connection.dialect,
                                   connection, cursor, plan.sql, values, None, disconnected,
                                   True, False)
    for listener in connection.dialect.dispatch.handle_error:
        listener(context)


def _reported(connection: Connection, plan: _Plan, error: Any,
              disconnected: bool) -> StatementError:
    # As SQLAlchemy reports a driver's error: its own exception class, and a
    # connection that died is invalidated, so the pool replaces it. The
    # parameters stay out of the message (they may be token digests).
    dialect = connection.dialect
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
