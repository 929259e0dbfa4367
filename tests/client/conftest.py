"""A served gateway for the client SDK and the ``mcp`` helpers, and a user who answers links.

One real ``gateway serve`` (TLS with its self-signed development
certificate, local login backend, payments switched on without ever
reaching Stripe, and the shipped catalog plus one OAuth type, ``forge``,
whose provider is never reached) is shared by the tests of this package;
the database is emptied when they are done. Each test registers its own MCP
server (client) and its own users, so tests do not see each other's
elicitations.
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import pytest
import requests
from flask import Flask

from gateway import db, resources
from gateway.app import create_app
from gateway.clients import service as clients
from gateway.clock import SystemClock
from gateway.credentials import service as credentials
from gateway.credentials.catalog import current_catalog
from gateway.credentials.models import Credential
from gateway.elicitations.models import Elicitation
from gateway.identity import service as identity
from gateway.oauth.tokens import seal_connection
from gateway.outbound import OutboundPolicy
from gateway.serving.tls import dev_certificate_paths
from gateway.settings import load_settings
from tests.conftest import _empty_tables, command_keyring, gateway_environ, process_environ
from tests.integration.conftest import free_port, tls_context

PASSWORD = "correct horse battery staple"
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')

# An OAuth credential type at a provider no test reaches: connections are
# sealed straight into the database, as the gateway's callback would.
OAUTH_TYPE: Final = "forge"
OAUTH_SCOPES: Final = ["read:user", "repo"]
CLIENT_SECRET_ENV: Final = "FORGE_CLIENT_SECRET"
_OAUTH_CATALOG: Final = f"""
[{OAUTH_TYPE}]
label = "Forge account"
kind = "oauth"

[{OAUTH_TYPE}.oauth]
authorization_url = "https://forge.example/login/oauth/authorize"
token_url = "https://forge.example/login/oauth/access_token"
userinfo_url = "https://forge.example/api/user"
scopes = {OAUTH_SCOPES!r}
client_id = "gateway-tests"
client_secret_env = "{CLIENT_SECRET_ENV}"
"""


@dataclass
class Registered:
    """An MCP server registered with the gateway: its API token and webhook secret."""

    client_id: str
    api_token: str
    webhook_secret: str


@dataclass
class ServedGateway:
    origin: str
    certfile: Path
    app: Flask

    def register(self, *, credential_types: list[str] | None = None) -> Registered:
        """A new client, as ``gateway clients create`` makes it."""
        settings = self.app.extensions["gateway.settings"]
        with self.app.app_context(), command_keyring(self.app) as keyring, \
                db.transaction() as session:
            minted = clients.create_client(
                session, SystemClock(), keyring=keyring,
                pepper=settings.token_pepper, catalog=current_catalog(),
                name=f"weather-mcp-{secrets.token_hex(3)}", webhook_url=None,
                credential_types=credential_types or [], actor="test",
                policy=OutboundPolicy.from_settings(settings))
        return Registered(minted.client.id, minted.api_token, minted.webhook_secret)

    def connect_account(self, elicitation_id: str, access_token: str, *, account: str,
                        scopes: list[str] | None = None) -> str:
        """The user connected their account: the token set sealed, the elicitation completed.

        What the gateway's OAuth callback does once the provider has answered;
        the access token lasts a year, so no reveal needs to refresh it. The
        new credential's id.
        """
        answer: dict[str, Any] = {"access_token": access_token, "token_type": "Bearer",
                                  "expires_in": int(timedelta(days=365).total_seconds()),
                                  "refresh_token": "refresh-" + access_token}
        clock = SystemClock()
        with self.app.app_context(), command_keyring(self.app) as keyring, \
                db.transaction() as session:
            elicitation = session.get(Elicitation, elicitation_id)
            assert elicitation is not None
            credential_type = current_catalog().get(elicitation.credential_type or "")
            assert credential_type is not None
            credential = seal_connection(
                keyring, elicitation, credential_type, answer,
                scopes=scopes if scopes is not None else list(elicitation.scopes or []),
                account=account, now=clock.now())
            credentials.capture(session, clock, elicitation, credential, actor="test",
                                source_ip=None)
            return credential.id

    def refresh_refused(self, credential_id: str) -> None:
        """The provider refused to refresh the connection, so the gateway revoked it."""
        with self.app.app_context(), db.transaction() as session:
            credential = session.get(Credential, credential_id)
            assert credential is not None
            credentials.revoke(session, SystemClock(), credential, actor="test",
                               source_ip=None, reason=credentials.Reason.REFRESH_FAILED)

    def user(self, prefix: str = "alice") -> str:
        """A new local account with the test password; its user name (its ``sub``)."""
        username = f"{prefix}.{secrets.token_hex(3)}"
        with self.app.app_context(), db.transaction() as session:
            identity.create_user(session, SystemClock(), username=username, password=PASSWORD,
                                 actor="test")
        return username


# Payments on, so payment elicitations can be made; no test opens Checkout.
PAYMENTS = {"GATEWAY_STRIPE_SECRET_KEY": "sk_test_" + "x" * 24,
            "GATEWAY_STRIPE_WEBHOOK_SECRET": "whsec_" + "y" * 32}


@pytest.fixture(scope="package")
def served(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedGateway]:
    with serving(database_url, tmp_path_factory.mktemp("client-gateway"), PAYMENTS) as gateway:
        yield gateway


@pytest.fixture(scope="package")
def served_without_payments(database_url: str, tmp_path_factory: pytest.TempPathFactory,
                            ) -> Iterator[ServedGateway]:
    """A second gateway on the same database, whose operator set up no Stripe keys."""
    with serving(database_url, tmp_path_factory.mktemp("client-gateway-no-payments"),
                 {}) as gateway:
        yield gateway


@contextmanager
def serving(database_url: str, workdir: Path, extra: dict[str, str]) -> Iterator[ServedGateway]:
    """``gateway serve`` on a free port with ``extra`` settings; the database emptied after."""
    instance = workdir / "instance"
    instance.mkdir(mode=0o700)
    port = free_port()
    origin = f"https://localhost:{port}"
    catalog = workdir / "credential_types.toml"
    catalog.write_text((resources.CONFIG / "credential_types.toml").read_text() + _OAUTH_CATALOG)
    client_secret = {CLIENT_SECRET_ENV: "forge-client-secret-" + secrets.token_hex(8)}
    settings_environ = {
        **gateway_environ(instance, database_url, origin),
        "GATEWAY_LOGIN_BACKEND": "local",
        "GATEWAY_RATELIMIT_LOGIN": "1000 per minute",
        "GATEWAY_CREDENTIAL_TYPES_FILE": str(catalog),
        **extra,
    }
    environ = {**process_environ(settings_environ), **client_secret}
    log = workdir / "serve.log"
    with log.open("w") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--port", str(port), "--workers", "1"],
            env=environ, cwd=workdir, stdout=handle, stderr=subprocess.STDOUT, text=True)
    certfile, _ = dev_certificate_paths(instance)
    app = create_app(load_settings(settings_environ))
    # The catalog this process reads (on first use) needs the client secret too.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CLIENT_SECRET_ENV, client_secret[CLIENT_SECRET_ENV])
        try:
            _wait_until_healthy(origin, certfile, process, log)
            yield ServedGateway(origin, certfile, app)
        finally:
            _stop(process, app, database_url)


def _stop(process: subprocess.Popen[str], app: Flask, database_url: str) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    app.extensions["gateway.engine"].dispose()
    engine = db.make_engine(database_url)
    try:
        _empty_tables(engine)
    finally:
        engine.dispose()


def _wait_until_healthy(origin: str, certfile: Path, process: subprocess.Popen[str],
                        log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"gateway serve exited early:\n{log.read_text()}")
        if certfile.exists():
            try:
                with urllib.request.urlopen(origin + "/healthz", timeout=2,
                                            context=tls_context(certfile)) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
        time.sleep(0.1)
    raise AssertionError(f"gateway serve did not start:\n{log.read_text()}")


class User:
    """A person with a browser: logs in to the gateway and answers the links they get."""

    def __init__(self, served: ServedGateway, username: str) -> None:
        self.served = served
        self.username = username
        self.http = requests.Session()
        self.http.trust_env = False
        self.http.verify = str(served.certfile)

    def _form(self, path: str, fields: dict[str, str]) -> requests.Response:
        page = self.http.get(self.served.origin + path, timeout=10)
        found = _CSRF.search(page.text)
        assert found, f"no form on {path}: {page.status_code}"
        return self.http.post(self.served.origin + path, timeout=10,
                              data={"csrf_token": found.group(1), **fields})

    def log_in(self) -> None:
        answer = self._form("/login", {"username": self.username, "password": PASSWORD,
                                       "next": "/"})
        assert answer.ok, answer.status_code
        assert self.http.cookies.get("__Host-gateway_session"), "login set no session cookie"

    def enter_key(self, url: str, secret: str) -> None:
        """Open the link and submit ``secret``."""
        if not self.http.cookies.get("__Host-gateway_session"):
            self.log_in()
        path = url.removeprefix(self.served.origin)
        answer = self._form(path, {"action": "submit", "secret": secret})
        assert answer.status_code == 200, answer.text[:500]

    def decline(self, url: str) -> None:
        if not self.http.cookies.get("__Host-gateway_session"):
            self.log_in()
        answer = self._form(url.removeprefix(self.served.origin), {"action": "decline"})
        assert answer.status_code == 200, answer.text[:500]

    def enter_key_later(self, url: str, secret: str, delay: float) -> threading.Thread:
        """Enter the key ``delay`` seconds from now, in the background (a slow human)."""
        self.log_in()
        thread = threading.Thread(target=lambda: (time.sleep(delay), self.enter_key(url, secret)),
                                  daemon=True)
        thread.start()
        return thread


@pytest.fixture
def user(served: ServedGateway) -> User:
    return User(served, served.user())
