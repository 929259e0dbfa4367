"""``gateway keys``: rotation with many stored secrets loses nothing, even when interrupted."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from gateway import db
from gateway.clients.models import Client
from gateway.clock import SystemClock
from gateway.credentials.models import Credential
from gateway.credentials.service import binding, reveal_secret
from gateway.elicitations.models import Elicitation
from gateway.vault import versions as key_versions
from gateway.vault.envelope import seal
from gateway.vault.keyring import read_keyring_file
from gateway.vault.models import KeyVersion, VaultInstance
from gateway.vault.versions import KeyVersions
from tests.integration.conftest import GATEWAY, Result

pytestmark = pytest.mark.slow

COUNT = 10_000
NOW = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.fixture
def base_environ(base_environ: dict[str, str]) -> dict[str, str]:
    """The instance keyring file, not the environment: rotation leaves it as it is."""
    return {k: v for k, v in base_environ.items() if k != "GATEWAY_ENCRYPTION_KEYS"}


@pytest.fixture
def keyring_file(instance_path: Path) -> Path:
    path = instance_path / "keyring"
    path.write_text(f"v1:{base64.b64encode(b'1' * 32).decode()}\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def stored(engine: Engine, keyring_file: Path) -> dict[str, str]:
    """COUNT credentials sealed under v1; id to plaintext."""
    keyring = read_keyring_file(keyring_file)
    secrets: dict[str, str] = {}
    elicitations: list[Elicitation] = []
    credentials: list[Credential] = []
    with Session(engine) as session:
        session.add(Client(id="cl_keys", name="keys", status="active", credential_types=[],
                           created_at=NOW))
        # Listed, as the first process to wrap with it lists it: the sealed rows refer to it.
        session.add(KeyVersion(version=1, root_version=None, wrapped_key=None, created_at=NOW))
        session.flush()
        for number in range(COUNT):
            elicitation = Elicitation(
                id=f"el_{number:06d}", client_id="cl_keys", subject_iss="https://i",
                subject_sub=f"u{number}", kind="api_key", credential_type="generic",
                message="m", metadata_={}, status="completed", created_at=NOW,
                expires_at=NOW + timedelta(minutes=15))
            credential = Credential(
                id=f"cr_{number:06d}", client_id="cl_keys", subject_iss="https://i",
                subject_sub=f"u{number}", type="generic", hint="…", created_at=NOW,
                elicitation_id=elicitation.id)
            secret = f"secret-number-{number}"
            credential.envelope = seal(keyring, secret.encode(), binding(credential))
            elicitations.append(elicitation)
            credentials.append(credential)
            secrets[credential.id] = secret
        # Elicitations first: the credentials' foreign keys point at them.
        session.add_all(elicitations)
        session.flush()
        session.add_all(credentials)
        session.commit()
    return secrets


def versions(engine: Engine) -> dict[int, int]:
    # A read only: on SQLite it must not queue for the write lock, which a rewrap
    # committing batch after batch takes again before a waiting poller gets it.
    with Session(db.for_reads(engine)) as session:
        rows = session.execute(select(Credential.key_version, func.count())
                               .group_by(Credential.key_version)).all()
        return {row[0]: row[1] for row in rows}


def stored_versions(engine: Engine) -> list[int]:
    """The key versions in the database, newest first."""
    with Session(engine) as session:
        return sorted(key_versions.stored(session), reverse=True)


def ok(result: Result) -> str:
    assert result.code == 0, result.stderr
    return result.stdout


def test_rotate_rewrap_interrupted_resume_and_retire_lose_nothing(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str], tmp_path: Path,
    engine: Engine, keyring_file: Path, stored: dict[str, str],
) -> None:
    keyring_text = keyring_file.read_text()
    ok(invoke_gateway("keys", "rotate"))
    assert stored_versions(engine) == [2, 1]
    # The new version is in the database, sealed by the root key: the file is as it was.
    assert keyring_file.read_text() == keyring_text
    assert keyring_file.stat().st_mode & 0o077 == 0
    assert "v1 is" not in ok(invoke_gateway("keys", "list"))

    # Killed halfway: some batches committed, the rest still under v1.
    process = subprocess.Popen([*GATEWAY, "keys", "rewrap"], env=cli_environ, cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while versions(engine).get(2, 0) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    partial = versions(engine)
    assert 0 < partial.get(2, 0) < COUNT, partial

    refused = invoke_gateway("keys", "retire", "v1")
    assert refused.code == 1
    assert "still use v1" in refused.stderr

    ok(invoke_gateway("keys", "rewrap", "--max", "1000"))
    assert versions(engine).get(2, 0) == min(COUNT, partial[2] + 1000)
    ok(invoke_gateway("keys", "rewrap"))
    assert versions(engine) == {2: COUNT}

    ok(invoke_gateway("keys", "retire", "v1"))
    assert stored_versions(engine) == [2]
    # What opens them: the keyring file (the root key) and the database's versions.
    keyring = KeyVersions(engine, lambda: read_keyring_file(keyring_file), SystemClock(),
                          role="test")
    with Session(engine) as session:
        for credential in session.scalars(select(Credential)):
            assert reveal_secret(keyring, credential) == stored[credential.id]


def test_retiring_the_current_version_is_refused(
    invoke_gateway: Callable[..., Result], keyring_file: Path,
) -> None:
    result = invoke_gateway("keys", "retire", "v1")
    assert result.code == 1
    assert "current version" in result.stderr


def test_an_environment_keyring_needs_no_change_to_rotate(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str], engine: Engine,
) -> None:
    entry = f"v1:{base64.b64encode(b'e' * 32).decode()}"
    environ = {**cli_environ, "GATEWAY_ENCRYPTION_KEYS": entry}
    result = ok(invoke_gateway("keys", "rotate", env=environ))
    assert "v2" in result
    assert entry.split(":")[1] not in result
    assert stored_versions(engine) == [2, 1]
    listed = json.loads(ok(invoke_gateway("keys", "list", "--json", env=environ)))
    assert [(v["version"], v["current"]) for v in listed["versions"]] == [
        ("v2", True), ("v1", False)]
    assert listed["root"] == "v1"


@pytest.mark.parametrize("name", ["v1", "1"])
def test_retiring_is_refused_while_a_running_instance_still_wraps_with_the_version(
    invoke_gateway: Callable[..., Result], engine: Engine, keyring_file: Path, name: str,
) -> None:
    running = KeyVersions(engine, lambda: read_keyring_file(keyring_file), SystemClock(),
                          role="web")
    assert running.current_version == 1  # and its heartbeat says so
    ok(invoke_gateway("keys", "rotate"))
    # No secret uses v1, but the instance may seal one with it any moment.
    refused = invoke_gateway("keys", "retire", name)
    assert refused.code == 1
    assert "still wrap new secrets with v1" in refused.stderr
    assert stored_versions(engine) == [2, 1]
    listed = json.loads(ok(invoke_gateway("keys", "list", "--json")))
    assert [i["wraps_with"] for i in listed["instances"]] == ["v1"]
    status = json.loads(ok(invoke_gateway("status", "--json")))["keys"]
    assert (status["current"], status["stored_in"]) == (2, "database")
    assert [(i["role"], i["wraps_with"]) for i in status["instances"]] == [("web", "v1")]

    running.refresh()  # as it does by itself within REFRESH
    ok(invoke_gateway("keys", "retire", name))
    assert stored_versions(engine) == [2]


@pytest.mark.parametrize("name", ["v1", "1", "V1"])
def test_a_heartbeat_gone_stale_no_longer_holds_a_version(
    invoke_gateway: Callable[..., Result], engine: Engine, keyring_file: Path, name: str,
) -> None:
    stopped = KeyVersions(engine, lambda: read_keyring_file(keyring_file), SystemClock(),
                          role="web")
    assert stopped.current_version == 1
    ok(invoke_gateway("keys", "rotate"))
    with Session(engine) as session, session.begin():
        for beat in session.scalars(select(VaultInstance)):
            beat.seen_at -= key_versions.HEARTBEAT_FRESH
    # However the version was written, the messages and the audit trail say v1.
    assert ok(invoke_gateway("keys", "retire", name)).startswith("v1 retired\n")
    assert stored_versions(engine) == [2]
    retired = json.loads(ok(invoke_gateway("audit", "--action", "keys.retired", "--json")))
    assert [record["target"] for record in retired] == ["v1"]


def test_retiring_a_version_that_is_not_there_is_refused(
    invoke_gateway: Callable[..., Result], keyring_file: Path,
) -> None:
    ok(invoke_gateway("keys", "rotate"))
    for name in ("v7", "7", "V7", "v07"):
        refused = invoke_gateway("keys", "retire", name)
        assert refused.code == 1
        assert "v7 is not a key version" in refused.stderr
    for malformed in ("seven", "v", "v-1", "²"):
        refused = invoke_gateway("keys", "retire", malformed)
        assert refused.code == 2
        assert f"a key version looks like v2 (or 2), not {malformed!r}" in refused.stderr


def _store_sealed_rows(engine: Engine, keyring_file: Path, count: int) -> dict[str, str]:
    """``count`` credentials sealed under v1 and committed; id to plaintext."""
    keyring = read_keyring_file(keyring_file)
    secrets: dict[str, str] = {}
    with Session(engine) as session, session.begin():
        session.add(Client(id="cl_few", name="few", status="active", credential_types=[],
                           created_at=NOW))
        if session.get(KeyVersion, 1) is None:
            session.add(KeyVersion(version=1, root_version=None, wrapped_key=None,
                                   created_at=NOW))
        session.flush()
        for number in range(count):
            elicitation = Elicitation(
                id=f"el_few{number}", client_id="cl_few", subject_iss="https://i",
                subject_sub=f"f{number}", kind="api_key", credential_type="generic",
                message="m", metadata_={}, status="completed", created_at=NOW,
                expires_at=NOW + timedelta(minutes=15))
            session.add(elicitation)
            session.flush()
            credential = Credential(
                id=f"cr_few{number}", client_id="cl_few", subject_iss="https://i",
                subject_sub=f"f{number}", type="generic", hint="…", created_at=NOW,
                elicitation_id=elicitation.id)
            credential.envelope = seal(keyring, f"few-{number}".encode(), binding(credential))
            session.add(credential)
            secrets[credential.id] = f"few-{number}"
    return secrets


def test_rewrap_names_a_secret_that_does_not_open_and_rewraps_the_rest(
    invoke_gateway: Callable[..., Result], engine: Engine, keyring_file: Path,
) -> None:
    secrets = _store_sealed_rows(engine, keyring_file, 3)
    with Session(engine) as session, session.begin():
        damaged = session.get(Credential, "cr_few1")
        assert damaged is not None
        damaged.wrapped_key = bytes(len(damaged.wrapped_key))  # altered at rest
    ok(invoke_gateway("keys", "rotate"))

    result = invoke_gateway("keys", "rewrap")
    assert result.code == 1
    lines = result.stderr.strip().splitlines()
    assert [line for line in lines if "cr_few1" in line] == [
        "credential cr_few1 (v1) does not open: the data key does not unwrap: altered, or "
        "not stored for this row"]
    assert lines[-1].startswith("Error: 1 secret(s) did not open")
    assert "2 secret(s) now wrapped by v2" in result.stdout
    assert versions(engine) == {1: 1, 2: 2}
    keyring = KeyVersions(engine, lambda: read_keyring_file(keyring_file), SystemClock(),
                          role="test")
    with Session(engine) as session:
        for credential_id in ("cr_few0", "cr_few2"):
            credential = session.get(Credential, credential_id)
            assert credential is not None
            assert reveal_secret(keyring, credential) == secrets[credential_id]

    # The keyring is right: status says that one secret does not open, not "wrong keyring".
    status = invoke_gateway("status", "--json")
    assert status.code == 1
    error = json.loads(status.stdout)["keys"]["error"]
    assert "wrong keyring" not in error
    assert "v1" in error
    assert "do not open" in error


def test_a_retire_racing_a_store_under_its_version_cannot_both_commit(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str], tmp_path: Path,
    engine: Engine, keyring_file: Path,
) -> None:
    _store_sealed_rows(engine, keyring_file, 0)
    ok(invoke_gateway("keys", "rotate"))
    with Session(engine) as session, session.begin():
        session.add(Elicitation(
            id="el_race", client_id="cl_few", subject_iss="https://i", subject_sub="race",
            kind="api_key", credential_type="generic", message="m", metadata_={},
            status="completed", created_at=NOW, expires_at=NOW + timedelta(minutes=15)))
    credential = Credential(id="cr_race", client_id="cl_few", subject_iss="https://i",
                            subject_sub="race", type="generic", hint="…", created_at=NOW,
                            elicitation_id="el_race")
    credential.envelope = seal(read_keyring_file(keyring_file), b"in-flight",
                               binding(credential))
    assert credential.key_version == 1
    # A store under v1 written, not committed yet, when the retire of v1 starts.
    with Session(engine) as session, session.begin():
        session.add(credential)
        session.flush()
        retire = subprocess.Popen([*GATEWAY, "keys", "retire", "v1"], env=cli_environ,
                                  cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        time.sleep(2)  # the retire counts no secret under v1, and tries to delete it
    stdout, stderr = retire.communicate(timeout=60)
    assert retire.returncode == 1, stdout
    # PostgreSQL: the delete waits for the store and is refused by the foreign key;
    # SQLite: the retire waits for the store's commit and counts it. One line either way.
    assert stderr.strip().splitlines() == [stderr.strip()]
    assert "v1" in stderr
    assert "gateway keys rewrap" in stderr
    assert stored_versions(engine) == [2, 1]
    with Session(engine) as session:
        stored = session.get(Credential, "cr_race")
        assert stored is not None
        keyring = KeyVersions(engine, lambda: read_keyring_file(keyring_file), SystemClock(),
                              role="test")
        assert reveal_secret(keyring, stored) == "in-flight"


def test_a_command_that_sealed_a_secret_holds_no_version_once_it_ends(
    invoke_gateway: Callable[..., Result], engine: Engine, keyring_file: Path,
) -> None:
    ok(invoke_gateway("clients", "create", "mcp"))  # seals its webhook secret under v1
    ok(invoke_gateway("keys", "rotate"))
    ok(invoke_gateway("keys", "rewrap"))
    # No "running instance still wraps with v1": the command is gone.
    ok(invoke_gateway("keys", "retire", "v1"))
    assert stored_versions(engine) == [2]
