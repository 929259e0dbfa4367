"""The canary for commands that mint or handle secrets: at debug level, in either log
format, a secret shows once on stdout where the command means to show it, and never in the
log (stderr, where every command logs).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy.orm import Session

from gateway import db
from gateway.clock import SystemClock
from gateway.identity import service as identity
from gateway.vault import versions
from gateway.vault.keyring import KEYRING_FILE, parse_keyring
from tests.conftest import TEST_KEYRING, Api, Registered, client_for
from tests.integration.conftest import Result
from tests.integration.log_canary import assert_nowhere, records, tell_tales
from tests.integration.portal.conftest import PASSWORD, Browser

pytestmark = pytest.mark.slow

CANARY_KEY = "sk-canary-cli-7d3e9b1f5a2c"
Run = Callable[..., Result]


@pytest.fixture(params=["json", "text"])
def log_format(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def logged(run_gateway: Run, cli_environ: dict[str, str], log_format: str) -> Run:
    """Run a command at debug level in the format under test; it must succeed and log."""

    def run(*args: str, environ: dict[str, str] | None = None) -> Result:
        result = run_gateway(*args, env={**(environ or cli_environ), "GATEWAY_LOG_LEVEL": "debug",
                                         "GATEWAY_LOG_FORMAT": log_format})
        assert result.code == 0, result.stderr
        # Every stderr line is a record (so nothing slipped out some other way),
        # and there are debug records: the log was on at its most talkative.
        assert any(r["level"] == "debug" for r in records(result.stderr, log_format)), \
            result.stderr
        return result

    return run


def test_client_secrets_show_once_and_never_in_the_log(logged: Run) -> None:
    created = logged("clients", "create", "Canary MCP", "--webhook-url",
                     "https://mcp.example.com/hooks", "--json")
    minted = json.loads(created.stdout)
    rotated = logged("clients", "rotate-token", "Canary MCP")
    [token] = re.findall(r"gw_[\w-]+", rotated.stdout)
    renewed = logged("clients", "rotate-webhook-secret", "Canary MCP")
    [secret] = re.findall(r"whsec_[\w+/=]+", renewed.stdout)
    shown = logged("clients", "show", "Canary MCP", "--json")

    for output, printed in ((created.stdout, minted["api_token"]),
                            (created.stdout, minted["webhook_secret"]),
                            (rotated.stdout, token), (renewed.stdout, secret)):
        assert output.count(printed) == 1
    every = [*tell_tales(minted["api_token"]), *tell_tales(minted["webhook_secret"]),
             *tell_tales(token), *tell_tales(secret)]
    assert_nowhere(every, create_log=created.stderr, rotate_token_log=rotated.stderr,
                   rotate_secret_log=renewed.stderr, show=shown.stdout, show_log=shown.stderr)
    # Each command shows only the secret it mints.
    assert_nowhere([minted["api_token"], minted["webhook_secret"]], rotate_token=rotated.stdout,
                   rotate_secret=renewed.stdout)


def test_a_stored_key_never_shows_in_the_credentials_commands(
    app: Flask, register: Callable[..., Registered], logged: Run,
) -> None:
    credential_id = store_key(app, register, CANARY_KEY)
    results = [logged("credentials", "list"), logged("credentials", "list", "--json"),
               logged("credentials", "revoke", credential_id),
               logged("credentials", "list", "--all", "--json"),
               logged("credentials", "purge", "--revoked-older-than", "1h")]
    assert credential_id in results[1].stdout  # the commands did see it
    # The hint (its last four characters) is meant to show; the rest never.
    for result in results:
        assert_nowhere([CANARY_KEY, CANARY_KEY[:-4]], stdout=result.stdout, log=result.stderr)


def store_key(app: Flask, register: Callable[..., Registered], secret: str) -> str:
    """A key a user entered through the portal, as the service stores it; its id."""
    with app.app_context(), db.transaction() as session:
        identity.create_user(session, SystemClock(), username="alice", password=PASSWORD,
                             actor="test")
    api = Api(client_for(app), register().api_token)
    settings = app.extensions["gateway.settings"]
    link = api.post("/api/v1/elicitations", {
        "subject": {"iss": settings.public_url, "sub": "alice"}, "kind": "api_key",
        "credential_type": "generic", "message": "Your key, please"}).get_json()
    alice = Browser(client_for(app))
    alice.log_in("alice")
    assert alice.post_form(f"/e/{link['id']}", {"action": "submit", "secret": secret}) \
        .status_code == 200
    [stored] = api.get("/api/v1/credentials").get_json()["items"]
    credential_id: str = stored["id"]
    return credential_id


def key_material(keyring: str) -> list[str]:
    """The base64 keys of a keyring (``v2:…,v1:…`` or one entry a line)."""
    return [entry.split(":", 1)[1] for entry in re.split(r"[,\n]", keyring)
            if ":" in entry and not entry.startswith("#")]


def stored_key_material(database_url: str, root: str) -> list[str]:
    """The base64 of every key version in the database, opened with the root keyring."""
    engine = db.make_engine(database_url)
    try:
        with Session(engine) as session:
            keyring = parse_keyring(re.split(r"[,\n]", root.strip()), "test")
            return [base64.b64encode(versions.open_version(keyring, row)).decode()
                    for row in versions.stored(session).values()]
    finally:
        engine.dispose()


def test_a_rotation_of_an_environment_keyring_shows_no_key_and_logs_none(
    logged: Run, cli_environ: dict[str, str],
) -> None:
    results = [logged("keys", "rotate"), logged("keys", "list", "--json"),
               logged("keys", "rewrap")]
    material = [*key_material(TEST_KEYRING),
                *stored_key_material(cli_environ["GATEWAY_DATABASE_URL"], TEST_KEYRING)]
    assert len(material) == 3  # the rotation happened: the root, v1 and v2
    for result in results:
        assert_nowhere([*material, *(key[:16] for key in material)], stdout=result.stdout,
                       log=result.stderr)


def test_a_rotation_of_the_keyring_file_shows_no_key(
    logged: Run, cli_environ: dict[str, str], instance_path: Path,
) -> None:
    environ = {k: v for k, v in cli_environ.items() if k != "GATEWAY_ENCRYPTION_KEYS"}
    keyring = instance_path / KEYRING_FILE
    keyring.write_text(f"v1:{base64.b64encode(b'2' * 32).decode()}\n")
    keyring.chmod(0o600)
    results = [logged("keys", "rotate", environ=environ),
               logged("keys", "list", "--json", environ=environ)]
    material = [*key_material(keyring.read_text()),
                *stored_key_material(environ["GATEWAY_DATABASE_URL"], keyring.read_text())]
    assert len(material) == 3  # the rotation happened
    for result in results:
        assert_nowhere([*material, *(key[:16] for key in material)], stdout=result.stdout,
                       log=result.stderr)
