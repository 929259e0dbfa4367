"""A request is one unit of work: one transaction, the token check inside it.

A request that changes state begins one transaction, as one that writes (on
SQLite it takes the write lock once, at its token check); a request that
only reads never takes the lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import Connection, event

from gateway import db, sqlite
from gateway.clients import service as clients
from gateway.clock import SystemClock
from tests.conftest import Api, Registered
from tests.integration.api.test_create import body

READ, WRITE = "read", "write"


@pytest.fixture
def transactions(app: Flask) -> Iterator[list[str]]:
    """How each transaction the app begins from now on began: as a read or as a write."""
    with transactions_of(app) as begun:
        yield begun


@contextmanager
def transactions_of(app: Flask) -> Iterator[list[str]]:
    """While the block runs: how each transaction of the app began, as a read or a write."""
    begun: list[str] = []

    def began(connection: Connection) -> None:
        reads = connection.get_execution_options().get(sqlite.READS, False)
        begun.append(READ if reads else WRITE)

    engine = db.engine_of(app)
    event.listen(engine, "begin", began)
    yield begun
    event.remove(engine, "begin", began)


def only_sqlite_tells(kinds: list[str], app: Flask) -> list[str]:
    """On PostgreSQL no transaction takes a lock to begin: only their number tells."""
    if db.engine_of(app).dialect.name == "sqlite":
        return kinds
    return ["begun"] * len(kinds)


def counted(transactions: list[str], app: Flask, request: Callable[[], Any]) -> list[str]:
    transactions.clear()
    request()
    return only_sqlite_tells(list(transactions), app)


def test_a_create_is_one_transaction_that_writes_from_its_token_check(
    app: Flask, api: Api, transactions: list[str],
) -> None:
    def create() -> None:
        assert api.post("/api/v1/elicitations", json=body()).status_code == 201

    assert counted(transactions, app, create) == only_sqlite_tells([WRITE], app)


def test_a_read_never_takes_the_write_lock(
    app: Flask, api: Api, transactions: list[str],
) -> None:
    created = api.post("/api/v1/elicitations", json=body()).get_json()

    def read() -> None:
        assert api.get(f"/api/v1/elicitations/{created['id']}").status_code == 200

    assert counted(transactions, app, read) == only_sqlite_tells([READ], app)


@contextmanager
def statements_of(app: Flask) -> Iterator[list[str]]:
    """While the block runs: the SQL of each statement the app sends."""
    sent: list[str] = []

    def executing(connection: Connection, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    engine = db.engine_of(app)
    event.listen(engine, "before_cursor_execute", executing)
    yield sent
    event.remove(engine, "before_cursor_execute", executing)


def test_a_read_checks_the_token_and_reads_the_row_in_one_statement(
    app: Flask, api: Api,
) -> None:
    created = api.post("/api/v1/elicitations", json=body()).get_json()
    with statements_of(app) as sent:
        assert api.get(f"/api/v1/elicitations/{created['id']}").get_json() == created
    reads = [sql for sql in sent if "api_tokens" in sql or "elicitations" in sql]
    assert len(reads) == 1
    assert "api_tokens" in reads[0]
    assert "elicitations" in reads[0]


def test_a_cancel_is_one_transaction(app: Flask, api: Api, transactions: list[str]) -> None:
    created = api.post("/api/v1/elicitations", json=body()).get_json()

    def cancel() -> None:
        response = api.post(f"/api/v1/elicitations/{created['id']}/cancel")
        assert response.get_json()["status"] == "cancelled"

    assert counted(transactions, app, cancel) == only_sqlite_tells([WRITE], app)


def test_a_refused_change_writes_nothing_and_lets_the_lock_go(
    app: Flask, api: Api, transactions: list[str],
) -> None:
    # A body the API refuses after the token check: the write begun there
    # is rolled back, and the next request can write at once.
    refused = api.post("/api/v1/elicitations", json={"kind": "api_key"})
    assert refused.status_code == 422
    assert api.post("/api/v1/elicitations", json=body()).status_code == 201


def test_a_revoked_token_is_refused_on_its_next_request(
    app: Flask, register: Callable[..., Registered], api: Api,
) -> None:
    registered = register()
    caller = Api(api.client, registered.api_token)
    assert caller.get("/api/v1/elicitations").status_code == 200
    with app.app_context(), db.transaction() as session:
        [token] = clients.get_client(session, registered.id).tokens
        clients.revoke_token(session, SystemClock(), client_ref=registered.id,
                             token_id=token.id, actor="test")
    assert caller.get("/api/v1/elicitations").status_code == 401
    assert caller.post("/api/v1/elicitations", json=body()).status_code == 401
