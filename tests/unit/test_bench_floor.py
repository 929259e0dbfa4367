"""The benchmark's database floor: the bare app making each scenario's statements.

Run against the test database (SQLite or PostgreSQL), through the bare app's
Flask views, as the floor server runs them under load.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.bench_modules import bench_module


@pytest.fixture(scope="module")
def bench() -> dict[str, ModuleType]:
    """The modules of bench/ these tests use, by name."""
    return {name: bench_module(name)
            for name in ("floor", "bare", "scenarios", "servers", "report", "wrk")}


def _floor_target(bench: dict[str, ModuleType], url: str) -> str:
    if url.startswith("sqlite"):
        return f"sqlite:{make_url(url).database}"
    return str(bench["servers"].floor_database(Path("unused"), url))


@pytest.fixture
def floor_database(bench: dict[str, ModuleType], empty_database_url: str) -> Iterator[Any]:
    """The floor's statements on the scratch database; its connections closed afterwards."""
    database = bench["floor"].FloorDatabase(_floor_target(bench, empty_database_url))
    yield database
    database.close()


@pytest.fixture
def floored(bench: dict[str, ModuleType], floor_database: Any) -> FlaskClient:
    """The bare app with the floor, its table made."""
    floor_database.create_table()
    return bench["bare"].create_app(floor_database).test_client()


def _rows(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return int(connection.execute(text("SELECT count(*) FROM bench_floor")).scalar_one())
    finally:
        engine.dispose()


def _send(client: FlaskClient, request: Any) -> int:
    path = request.path.replace("{id}", "el_floor")
    response = client.open(path, method=request.method, data=request.body,
                           headers=dict(request.headers))
    return response.status_code


def test_a_create_makes_its_write_and_answers_as_the_bare_app(
        bench: dict[str, ModuleType], floored: FlaskClient, empty_database_url: str) -> None:
    create = bench["scenarios"].SCENARIOS["create"]
    before = _rows(empty_database_url)
    assert _send(floored, create.request) == 201
    assert _send(floored, create.request) == 201
    assert _rows(empty_database_url) == before + 2


def test_a_read_writes_nothing(bench: dict[str, ModuleType], floored: FlaskClient,
                               empty_database_url: str) -> None:
    read = bench["scenarios"].SCENARIOS["read"]
    before = _rows(empty_database_url)
    assert _send(floored, read.request) == 200
    assert _rows(empty_database_url) == before


def test_the_floor_needs_its_table(bench: dict[str, ModuleType], floor_database: Any) -> None:
    # Without create_table the statements fail: the floor really runs them.
    client = bench["bare"].create_app(floor_database).test_client()
    client.application.testing = False
    assert _send(client, bench["scenarios"].SCENARIOS["read"].request) == 500


def _connections_become(url: str, expected: int) -> bool:
    """Whether the scratch database's other connections come to ``expected`` (PostgreSQL).

    Waits a few seconds: a closed connection's server process ends a moment
    after the client closes it.
    """
    engine = create_engine(url)
    deadline = time.monotonic() + 5
    try:
        while True:
            with engine.connect() as connection:
                count = connection.execute(text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"),
                ).scalar_one()
            if count == expected or time.monotonic() > deadline:
                return bool(count == expected)
            time.sleep(0.05)
    finally:
        engine.dispose()


def test_connections_left_idle_are_closed_and_busy_ones_kept(
        bench: dict[str, ModuleType], floor_database: Any, empty_database_url: str) -> None:
    floor_database.create_table()
    with floor_database._connection() as busy:
        floor_database.run(["read"])  # a second connection, given back at once
        assert floor_database.close_idle(0.0) == 1
        busy.execute("SELECT 1")  # the one in use was left open
    if empty_database_url.startswith("postgresql"):
        assert _connections_become(empty_database_url, 1)
    assert floor_database.close_idle(60.0) == 0  # given back just now: kept
    assert floor_database.close_idle(0.0) == 1
    if empty_database_url.startswith("postgresql"):
        assert _connections_become(empty_database_url, 0)
    floor_database.run(["read", "write"])  # a closed pool opens again on demand


def test_the_floor_closes_its_idle_connections_on_its_own(
        bench: dict[str, ModuleType], floor_database: Any, empty_database_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    floor = bench["floor"]
    monkeypatch.setattr(floor, "IDLE_CLOSE_S", 0.05)
    monkeypatch.setattr(floor, "IDLE_CHECK_S", 0.02)
    floor_database.create_table()
    floor_database.run(["read"])
    deadline = time.monotonic() + 5
    while floor_database._opened and time.monotonic() < deadline:
        time.sleep(0.02)
    assert floor_database._opened == 0
    if empty_database_url.startswith("postgresql"):
        assert _connections_become(empty_database_url, 0)


def test_requests_beyond_the_pool_wait_for_a_connection(
        bench: dict[str, ModuleType], floor_database: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench["floor"], "POOL_SIZE", 2)
    floor_database.create_table()
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda _: floor_database.run(["read", "write"]), range(64)))
    assert floor_database._opened <= 2


@pytest.mark.backend_independent
def test_an_unknown_step_or_database_is_refused(bench: dict[str, ModuleType]) -> None:
    with pytest.raises(ValueError, match="scenario 'x': unknown floor step"):
        bench["floor"].check_steps("x", ("read", "update"))
    with pytest.raises(ValueError, match="sqlite:PATH or postgresql"):
        bench["floor"].FloorDatabase("mysql://somewhere/db")


@pytest.mark.backend_independent
def test_postgres_urls_reach_the_driver_in_its_own_form(bench: dict[str, ModuleType]) -> None:
    floor_database = bench["servers"].floor_database
    assert floor_database(Path("/x"), "postgresql+psycopg://bench@127.0.0.1:5432/scratch") \
        == "postgresql://bench@127.0.0.1:5432/scratch"
    assert floor_database(Path("/x"), None) == "sqlite:/x/floor.db"


@pytest.mark.backend_independent
def test_the_table_shows_the_gateway_against_the_floor(bench: dict[str, ModuleType]) -> None:
    report, wrk = bench["report"], bench["wrk"]
    result = report.ScenarioResult("create", "", "POST", "/x", targets={
        name: report.TargetResult() for name in ("bare", "gateway", report.FLOOR)})
    for bare, gateway, floor in ((2000.0, 800.0, 1600.0), (2000.0, 1000.0, 1600.0)):
        for name, rate in (("bare", bare), ("gateway", gateway), (report.FLOOR, floor)):
            result.targets[name].runs.append(wrk.parse(_REPORT.replace("RATE", str(rate))))
    lines = report.table([result]).splitlines()
    assert next(line for line in lines if "gateway/bare" in line).split()[1] == "0.45x"
    assert next(line for line in lines if "gateway/floor" in line).split()[1:3] == [
        "0.56x", "0.50-0.62"]
    document = json.loads(json.dumps(result.as_json()))
    assert document["ratio_gateway_to_floor"]["requests_per_second"] == 0.5625
    assert document["ratio_to_floor_per_round"] == [0.5, 0.625]


_REPORT = """\
  Latency Distribution
     50%  10.00ms
     75%   16.39ms
     90%   23.50ms
     99%   30.00ms
  31538 requests in 10.01s, 5.12MB read
Requests/sec:   RATE
"""
