"""``gateway keys``: rotation with many stored secrets loses nothing, even when interrupted."""

from __future__ import annotations

import base64
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from gateway import db
from gateway.clients.models import Client
from gateway.credentials.models import Credential
from gateway.credentials.service import binding, reveal_secret
from gateway.elicitations.models import Elicitation
from gateway.vault.envelope import seal
from gateway.vault.keyring import parse_keyring, read_keyring_file
from tests.integration.conftest import GATEWAY, Result

pytestmark = pytest.mark.slow

COUNT = 10_000
NOW = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.fixture
def base_environ(base_environ: dict[str, str]) -> dict[str, str]:
    """The instance keyring file, not the environment: rotation edits it."""
    return {k: v for k, v in base_environ.items() if k != "GATEWAY_ENCRYPTION_KEYS"}


@pytest.fixture
def engine(clean_database: str) -> Iterator[Engine]:
    engine = db.make_engine(clean_database)
    yield engine
    engine.dispose()


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
    # A reader, as the rewrap's writes must not wait for this look.
    with Session(db.for_reads(engine)) as session:
        rows = session.execute(select(Credential.key_version, func.count())
                               .group_by(Credential.key_version)).all()
        return {row[0]: row[1] for row in rows}


def ok(result: Result) -> str:
    assert result.code == 0, result.stderr
    return result.stdout


def test_rotate_rewrap_interrupted_resume_and_retire_lose_nothing(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str], tmp_path: Path,
    engine: Engine, keyring_file: Path, stored: dict[str, str],
) -> None:
    ok(invoke_gateway("keys", "rotate"))
    assert read_keyring_file(keyring_file).current_version == 2
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
    keyring = read_keyring_file(keyring_file)
    assert set(keyring.keys) == {2}
    with Session(engine) as session:
        for credential in session.scalars(select(Credential)):
            assert reveal_secret(keyring, credential) == stored[credential.id]


def test_retiring_the_current_version_is_refused(
    invoke_gateway: Callable[..., Result], keyring_file: Path,
) -> None:
    result = invoke_gateway("keys", "retire", "v1")
    assert result.code == 1
    assert "current version" in result.stderr


def test_an_environment_keyring_is_rotated_by_the_operator(
    invoke_gateway: Callable[..., Result], cli_environ: dict[str, str],
) -> None:
    entry = f"v1:{base64.b64encode(b'e' * 32).decode()}"
    result = ok(invoke_gateway("keys", "rotate",
                               env={**cli_environ, "GATEWAY_ENCRYPTION_KEYS": entry}))
    new_value = result.split("Set it to:")[1].split()[0]
    rotated = parse_keyring(new_value.split(","), "printed")
    assert set(rotated.keys) == {1, 2}
