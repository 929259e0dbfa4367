"""Fixtures shared by every test: settings → app → client, one database per run.

The database is SQLite unless TEST_DATABASE_URL names a PostgreSQL server
(the suite runs on both). Each run migrates a scratch database once; each test
leaves it empty again, so tests are isolated without paying for migrations.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine

from gateway import db, migrations
from gateway.app import create_app
from gateway.settings import Settings, load_settings
from tests import databases

TEST_SECRET = "test-secret-" + "x" * 40
TEST_PEPPER = "test-pepper-" + "y" * 40


# --- no network beyond this machine ---------------------------------------------

_real_connect = socket.socket.connect


def _guarded_connect(self: socket.socket, address: Any) -> Any:
    if self.family in (socket.AF_INET, socket.AF_INET6):
        host = address[0]
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback:
            raise RuntimeError(f"test tried to reach the network: {address!r}")
    return _real_connect(self, address)


@pytest.fixture(autouse=True, scope="session")
def _no_network() -> Iterator[None]:
    socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
    yield
    socket.socket.connect = _real_connect  # type: ignore[method-assign]


# --- database ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A migrated scratch database for this run."""
    with databases.scratch_database(tmp_path_factory.mktemp("db")) as url:
        engine = db.make_engine(url)
        migrations.upgrade(engine)
        engine.dispose()
        yield url


@pytest.fixture
def empty_database_url(tmp_path: Path) -> Iterator[str]:
    """A scratch database with no schema at all."""
    with databases.scratch_database(tmp_path) as url:
        yield url


# --- settings, app, client ----------------------------------------------------------


@pytest.fixture
def instance_path(tmp_path: Path) -> Path:
    path = tmp_path / "instance"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def base_environ(instance_path: Path, database_url: str) -> dict[str, str]:
    """The environment a test gateway runs with."""
    return {
        "GATEWAY_INSTANCE_PATH": str(instance_path),
        "GATEWAY_DATABASE_URL": database_url,
        "GATEWAY_SECRET_KEY": TEST_SECRET,
        "GATEWAY_TOKEN_PEPPER": TEST_PEPPER,
        "GATEWAY_PUBLIC_URL": "https://gateway.test",
    }


@pytest.fixture
def make_settings(base_environ: dict[str, str]) -> Callable[..., Settings]:
    """Settings from the test environment plus overrides given as GATEWAY_* names."""

    def make(**overrides: str) -> Settings:
        return load_settings({**base_environ, **overrides})

    return make


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings()


@pytest.fixture
def app(settings: Settings) -> Iterator[Flask]:
    application = create_app(settings)
    application.config["TESTING"] = True
    yield application
    _empty_tables(application.extensions["gateway.engine"])
    application.extensions["gateway.engine"].dispose()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    """A test client speaking HTTPS to the public host."""
    return client_for(app)


class _BaseUrlClient(FlaskClient):
    """A Flask test client whose requests go to one origin unless told otherwise."""

    base_url = "https://gateway.test"

    def open(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("base_url", self.base_url)
        return super().open(*args, **kwargs)


def client_for(app: Flask, base_url: str = "https://gateway.test") -> FlaskClient:
    """A test client of ``app`` whose requests go to ``base_url``."""
    app.test_client_class = _BaseUrlClient
    client = app.test_client()
    client.base_url = base_url  # type: ignore[attr-defined]
    return client


def _empty_tables(engine: Engine) -> None:
    with engine.begin() as connection:
        for table in reversed(db.Base.metadata.sorted_tables):
            connection.execute(table.delete())


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Unique names for things a test creates."""
    return lambda prefix: f"{prefix}-{secrets.token_hex(4)}"


def pytest_report_header(config: pytest.Config) -> str:
    return f"gateway test database: {databases.describe(os.environ.get('TEST_DATABASE_URL'))}"
