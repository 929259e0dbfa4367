"""Backup and restore as docs/deployment.md tells it: the copy reveals a stored key.

An instance made by ``gateway init`` stores a key through the portal; the
database is backed up with that page's commands while the gateway still has
it open, and restored beside a copy of the config and the keyring. The
restored instance passes ``gateway db current`` and ``gateway status`` and
reveals the key to the MCP server's old API token (its digest is keyed by
the config's pepper). The same database under another keyring opens nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from gateway import db
from gateway.app import create_app
from gateway.credentials.models import Credential
from gateway.credentials.service import reveal_secret
from gateway.settings import load_settings
from gateway.vault.envelope import VaultError
from gateway.vault.keyring import read_keyring_file
from tests import databases
from tests.conftest import Api, client_for, process_environ
from tests.integration.conftest import Result
from tests.integration.portal.conftest import PASSWORD, Browser

pytestmark = pytest.mark.slow

ORIGIN = "https://gateway.test"
SECRET = "backed-up-weather-key-0042"

# docs/deployment.md's online backup of a SQLite database, in its two forms.
SQLITE_CLI_BACKUP = ("{source}", ".backup '{target}'")
PYTHON_BACKUP = ("import sqlite3, sys; "
                 "sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))")


@dataclass
class Instance:
    """An instance folder and the environment the gateway runs in for it."""

    path: Path
    environ: dict[str, str]
    invoke: Callable[..., Result]

    def run(self, *args: str, stdin: str = "") -> str:
        """Run a gateway command for this instance; its output, after checking it succeeded."""
        done = self.invoke(*args, env=self.environ, stdin=stdin)
        assert done.code == 0, done.stderr
        return done.stdout

    @contextmanager
    def app(self) -> Iterator[Flask]:
        """The gateway app on this instance's settings, as ``gateway serve`` builds it."""
        application = create_app(load_settings(self.environ))
        try:
            yield application
        finally:
            application.extensions["gateway.engine"].dispose()


@pytest.fixture
def make_instance(tmp_path: Path,
                  invoke_gateway: Callable[..., Result]) -> Callable[..., Instance]:
    """Instance folders, each with only the GATEWAY_* settings given."""
    def make(name: str, **settings: str) -> Instance:
        path = tmp_path / name
        return Instance(path, process_environ({"GATEWAY_INSTANCE_PATH": str(path), **settings}),
                        invoke_gateway)

    return make


@dataclass
class Stored:
    api_token: str
    credential_id: str


def prepare(instance: Instance) -> str:
    """A new instance with one MCP server and one user, as an operator makes it; the API token."""
    instance.run("init", "--public-url", ORIGIN)
    instance.run("db", "upgrade")
    token: str = json.loads(instance.run("clients", "create", "Weather", "--json"))["api_token"]
    instance.run("users", "create", "alice", "--password-stdin", "--json", stdin=PASSWORD + "\n")
    return token


def store_a_key(app: Flask, token: str) -> Stored:
    """The MCP server asks alice for her key, and she enters it on the portal."""
    api = Api(client_for(app), token)
    created = api.post("/api/v1/elicitations", json={
        "subject": {"iss": ORIGIN, "sub": "alice"}, "kind": "api_key",
        "credential_type": "generic", "message": "Connect your weather key"})
    assert created.status_code == 201, created.json
    link = f"/e/{created.json['id']}"
    browser = Browser(client_for(app))
    browser.log_in("alice", next_path=link)
    done = browser.post_form(link, {"action": "submit", "secret": SECRET})
    assert "This request is complete" in done.get_data(as_text=True)
    [credential] = api.get("/api/v1/credentials").json["items"]
    return Stored(token, credential["id"])


def restore_files(backup: Instance, restored: Instance) -> None:
    """The config and keyring beside the restored database, private as before."""
    restored.path.mkdir(mode=0o700, exist_ok=True)
    for name in ("gateway.toml", "keyring"):
        shutil.copy2(backup.path / name, restored.path / name)


def assert_restored(restored: Instance, stored: Stored) -> None:
    """docs/deployment.md's checks: schema current, status healthy, and one key revealed."""
    assert restored.run("db", "current").strip().endswith("(current)")
    status = json.loads(restored.run("status", "--json"))
    assert status["database"]["current"] is True
    assert status["elicitations"]["completed"] == 1
    with restored.app() as app:
        revealed = Api(client_for(app), stored.api_token).post(
            f"/api/v1/credentials/{stored.credential_id}/reveal")
    assert revealed.status_code == 200, revealed.json
    assert revealed.json["secret"] == SECRET


def installed(program: str) -> str:
    """The program's full path; the test skips where it is not installed."""
    found = shutil.which(program)
    if found is None:
        pytest.skip(f"the {program} command is not installed")
    return found


def sqlite_backup(how: str, source: Path, target: Path) -> None:
    if how == "sqlite3":
        command = [installed("sqlite3"), *(part.format(source=source, target=target)
                                           for part in SQLITE_CLI_BACKUP)]
    else:
        command = [sys.executable, "-c", PYTHON_BACKUP, str(source), str(target)]
    subprocess.run(command, check=True, capture_output=True, timeout=60)


@pytest.mark.backend_independent  # its own SQLite file, whatever the run's database
@pytest.mark.parametrize("how", ["sqlite3", "python"])
def test_an_online_sqlite_backup_restores_with_its_keyring_and_config(
    make_instance: Callable[..., Instance], tmp_path: Path, how: str,
) -> None:
    live = make_instance("instance")
    token = prepare(live)
    backup = tmp_path / "gateway-backup.db"
    with live.app() as app:
        stored = store_a_key(app, token)
        # The gateway still holds the database open, the key's row in the
        # write-ahead log: what a copy with cp would miss or tear.
        assert (live.path / "gateway.db-wal").stat().st_size > 0
        sqlite_backup(how, live.path / "gateway.db", backup)

    restored = make_instance("restored")
    restore_files(live, restored)
    shutil.copy2(backup, restored.path / "gateway.db")
    assert_restored(restored, stored)

    # The database alone is no use: under any other keyring nothing opens.
    stranger = make_instance("stranger")
    stranger.run("init", "--public-url", ORIGIN)
    engine = db.make_engine(f"sqlite:///{restored.path / 'gateway.db'}")
    try:
        with Session(engine) as session:
            credential = session.get_one(Credential, stored.credential_id)
            with pytest.raises(VaultError):
                reveal_secret(read_keyring_file(stranger.path / "keyring"), credential)
    finally:
        engine.dispose()


def libpq_url(url: str) -> str:
    """The SQLAlchemy URL as pg_dump and pg_restore take it (no driver name)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def test_a_pg_dump_restores_into_a_new_database(
    make_instance: Callable[..., Instance], clean_database: str, tmp_path: Path,
) -> None:
    if not clean_database.startswith("postgresql"):
        pytest.skip("a PostgreSQL procedure: runs when TEST_DATABASE_URL names a server")
    pg_dump, pg_restore = installed("pg_dump"), installed("pg_restore")
    live = make_instance("instance", GATEWAY_DATABASE_URL=clean_database)
    token = prepare(live)
    dump = tmp_path / "gateway.dump"
    with live.app() as app:  # dumped while the gateway has the database open
        stored = store_a_key(app, token)
        subprocess.run([pg_dump, "--format=custom", f"--file={dump}",
                        libpq_url(clean_database)], check=True, capture_output=True, timeout=120)

    with databases.scratch_database(tmp_path) as empty:
        subprocess.run([pg_restore, "--no-owner", "--exit-on-error",
                        f"--dbname={libpq_url(empty)}", str(dump)],
                       check=True, capture_output=True, timeout=120)
        restored = make_instance("restored", GATEWAY_DATABASE_URL=empty)
        restore_files(live, restored)
        assert_restored(restored, stored)
