"""Fixtures shared by every test: settings → app → client, one database per run.

The database is SQLite unless TEST_DATABASE_URL names a PostgreSQL server
(the suite runs on both). Each run migrates a scratch database once; each test
leaves it empty again, so tests are isolated without paying for migrations.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import secrets
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine
from werkzeug.test import TestResponse

from gateway import db, migrations
from gateway.app import create_app
from gateway.clients import service as clients
from gateway.clock import FixedClock, SystemClock
from gateway.credentials.catalog import current_catalog
from gateway.outbound import OutboundPolicy
from gateway.settings import Settings, load_settings
from gateway.vault import versions
from gateway.vault.sealing import store_sealed
from gateway.vault.versions import KeyVersions
from tests import databases

# A real OpenID Connect provider on loopback, for the identity tests.
pytest_plugins = ["tests.oidc.fixtures"]

TEST_SECRET = "test-secret-" + "x" * 40
TEST_PEPPER = "test-pepper-" + "y" * 40
# A fixed key-encryption key, so the app and CLI commands in one test agree.
TEST_KEYRING = "v1:" + base64.b64encode(b"k" * 32).decode()


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
def clean_database(database_url: str) -> Iterator[str]:
    """The run's database, emptied again after the test, whoever wrote to it."""
    yield database_url
    engine = db.make_engine(database_url)
    try:
        _empty_tables(engine)
    finally:
        engine.dispose()


@pytest.fixture
def engine(clean_database: str) -> Iterator[Engine]:
    """An engine of its own on the test's database, as a command or another process has."""
    engine = db.make_engine(clean_database)
    yield engine
    engine.dispose()


def gateway_environ(instance_path: Path, database_url: str, public_url: str) -> dict[str, str]:
    """The settings every test gateway runs with: its folder, database, origin and test secrets."""
    return {
        "GATEWAY_INSTANCE_PATH": str(instance_path),
        "GATEWAY_DATABASE_URL": database_url,
        "GATEWAY_SECRET_KEY": TEST_SECRET,
        "GATEWAY_TOKEN_PEPPER": TEST_PEPPER,
        "GATEWAY_PUBLIC_URL": public_url,
        "GATEWAY_ENCRYPTION_KEYS": TEST_KEYRING,
    }


def process_environ(settings: dict[str, str]) -> dict[str, str]:
    """The environment of a gateway child process: none of our GATEWAY_*, then ``settings``."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    return {**environ, **settings}


@pytest.fixture
def base_environ(instance_path: Path, clean_database: str) -> dict[str, str]:
    """The environment a test gateway runs with."""
    return gateway_environ(instance_path, clean_database, "https://gateway.test")


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
def clock() -> FixedClock:
    """The app's clock: now, moving only when a test advances it."""
    return FixedClock(datetime.now(UTC))


@pytest.fixture
def app(settings: Settings, clock: FixedClock) -> Iterator[Flask]:
    application = create_app(settings, clock=clock)
    application.config["TESTING"] = True
    yield application
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
    # The audit trail is append-only for the gateway; the suite, as the
    # tables' owner, lifts that for the one transaction that empties it.
    with engine.begin() as connection, databases.audit_trail_writable(connection):
        for table in reversed(db.Base.metadata.sorted_tables):
            connection.execute(table.delete())


# --- clients of the API ---------------------------------------------------------------


@dataclass(frozen=True)
class Registered:
    """A client registered for a test, with the secrets shown at creation."""

    id: str
    name: str
    api_token: str
    webhook_secret: str


@contextmanager
def command_keyring(app: Flask) -> Iterator[KeyVersions]:
    """The key versions as a command holds them: read before its transaction, withdrawn after."""
    keyring = versions.for_command(app.extensions["gateway.settings"], db.engine_of(app),
                                   SystemClock(), role="cli")
    keyring.refresh()
    try:
        yield keyring
    finally:
        keyring.withdraw()


@pytest.fixture
def register(app: Flask, settings: Settings) -> Callable[..., Registered]:
    """Register API clients (MCP servers) the way `gateway clients create` does."""
    counter = iter(range(1, 1000))

    def make(name: str | None = None, *, credential_types: list[str] | None = None,
             webhook_url: str | None = None) -> Registered:
        name = name or f"mcp-server-{next(counter)}"
        with app.app_context(), command_keyring(app) as keyring:

            def attempt() -> clients.Minted:
                with db.transaction() as session:
                    return clients.create_client(
                        session, SystemClock(), keyring=keyring,
                        pepper=settings.token_pepper, catalog=current_catalog(),
                        name=name, webhook_url=webhook_url,
                        credential_types=credential_types or [], actor="test",
                        policy=OutboundPolicy.from_settings(settings))

            minted = store_sealed(keyring, attempt)
        return Registered(minted.client.id, minted.client.name, minted.api_token,
                          minted.webhook_secret)

    return make


class Api:
    """The JSON API as one registered client calls it."""

    def __init__(self, client: FlaskClient, token: str) -> None:
        self.client = client
        self.token = token

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", **(extra or {})}

    def get(self, path: str, **kwargs: Any) -> TestResponse:
        headers = self.headers(kwargs.pop("headers", None))
        return self.client.get(path, headers=headers, **kwargs)

    def post(self, path: str, json: Any = None, **kwargs: Any) -> TestResponse:
        headers = self.headers(kwargs.pop("headers", None))
        return self.client.post(path, json=json, headers=headers, **kwargs)


@pytest.fixture
def api(client: FlaskClient, register: Callable[..., Registered]) -> Api:
    """The API as a freshly registered client with access to every credential type."""
    return Api(client, register().api_token)


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Unique names for things a test creates."""
    return lambda prefix: f"{prefix}-{secrets.token_hex(4)}"


def pytest_report_header(config: pytest.Config) -> str:
    return f"gateway test database: {databases.describe(os.environ.get('TEST_DATABASE_URL'))}"
