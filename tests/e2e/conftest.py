"""Every part real, on loopback: the gateway, the OpenID Connect provider, the example MCP
server, the official SDK's client and Chromium.

One ``gateway serve`` logs users in at the test provider (tests/oidc) and
takes payments against the Stripe stub (tests/browser/stripe_stub.py). Each
test registers its own MCP server with ``gateway clients create`` and runs
examples/weather_server.py for it, on the one port the gateway's SSRF guard
lets it reach over plain HTTP, so no test sees another's keys or
elicitations. Users sign in to their MCP client at the same provider (as
its second client, ``other-app``): the example checks their ID tokens
against the provider's keys. test_weather.py drives the official SDK's
client directly; test_weather_client.py runs the client script of docs/sdk.md.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Page,
    expect,
)

from gateway import db
from gateway.client import GatewayClient
from gateway.serving.tls import dev_certificate_paths
from tests.browser.conftest import CHROMIUM, TIMEOUT_MS, pinned_chromium
from tests.browser.stripe_stub import StripeStub, running_stub
from tests.client.conftest import _wait_until_healthy
from tests.conftest import _empty_tables, gateway_environ, process_environ
from tests.e2e.mcp_user import WAIT
from tests.integration.conftest import free_port
from tests.integration.payments.conftest import event_body, stripe_signature
from tests.oidc.fixtures import OidcProvider

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "weather_server.py"
GATEWAY = [sys.executable, "-m", "gateway"]
STRIPE_WEBHOOK_SECRET = "whsec_test_e2e_" + "w" * 24


@pytest.fixture(scope="package")
def chromium_path() -> Path:
    """Debian's Chromium; ``./dev test`` installs it. CI must have it, locally we skip."""
    if not CHROMIUM.is_file():
        reason = f"{CHROMIUM} is missing: the end-to-end tests need Debian's chromium"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return CHROMIUM


@pytest.fixture(scope="package")
def weather_port() -> int:
    """The loopback port every test's example server listens on (known before the gateway)."""
    return free_port()


@pytest.fixture(scope="package")
def stripe_stub() -> Iterator[StripeStub]:
    with running_stub() as stub:
        yield stub


# --- the gateway ---------------------------------------------------------------------


@dataclass
class Gateway:
    """A running ``gateway serve`` that logs users in at the test provider."""

    origin: str
    environ: dict[str, str]
    workdir: Path
    certfile: Path
    stripe: StripeStub

    def run(self, *args: str) -> Any:
        """A gateway command against this instance; its JSON output."""
        done = subprocess.run([*GATEWAY, *args], env=self.environ, cwd=self.workdir,
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def send_stripe_event(self, event_type: str, session: dict[str, Any]) -> dict[str, Any]:
        """Stripe reporting on a Checkout Session: signed with the webhook secret, posted."""
        payload = event_body(event_type, session)
        answer = requests.post(
            f"{self.origin}/stripe/webhook", data=payload, timeout=WAIT, verify=str(self.certfile),
            headers={"Content-Type": "application/json",
                     "Stripe-Signature": stripe_signature(payload, STRIPE_WEBHOOK_SECRET,
                                                          int(time.time()))})
        assert answer.status_code == 200, answer.text
        received: dict[str, Any] = answer.json()
        return received


@pytest.fixture(scope="package")
def gateway(chromium_path: Path, database_url: str, oidc_provider: OidcProvider,
            stripe_stub: StripeStub, weather_port: int,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """``gateway serve`` with the OIDC login backend, payments and its webhook worker."""
    workdir = tmp_path_factory.mktemp("e2e-gateway")
    instance = workdir / "instance"
    instance.mkdir(mode=0o700)
    port = free_port()
    origin = f"https://localhost:{port}"
    environ = process_environ(gateway_environ(instance, database_url, origin))
    environ.update({
        "GATEWAY_LOGIN_BACKEND": "oidc",
        "GATEWAY_OIDC_ISSUER": oidc_provider.issuer,
        "GATEWAY_OIDC_CLIENT_ID": oidc_provider.client_id,
        "GATEWAY_OIDC_CLIENT_SECRET": oidc_provider.client_secret,
        "GATEWAY_STRIPE_SECRET_KEY": "sk_test_e2e_" + "s" * 24,
        "GATEWAY_STRIPE_WEBHOOK_SECRET": STRIPE_WEBHOOK_SECRET,
        "GATEWAY_STRIPE_API_BASE": stripe_stub.origin,
        # Plain http on loopback for exactly these: the provider, the Stripe stub,
        # and the example server's webhook endpoint.
        "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": ",".join((
            urlsplit(oidc_provider.issuer).netloc, f"127.0.0.1:{stripe_stub.port}",
            f"127.0.0.1:{weather_port}")),
    })
    log = workdir / "serve.log"
    with log.open("w") as handle:
        process = subprocess.Popen(
            [*GATEWAY, "serve", "--port", str(port), "--workers", "1"],
            env=environ, cwd=workdir, stdout=handle, stderr=subprocess.STDOUT, text=True)
    certfile, _ = dev_certificate_paths(instance)
    try:
        _wait_until_healthy(origin, certfile, process, log)
        yield Gateway(origin, environ, workdir, certfile, stripe_stub)
    finally:
        _stop(process)
        engine = db.make_engine(database_url)
        try:
            _empty_tables(engine)
        finally:
            engine.dispose()


@pytest.fixture(autouse=True)
def _gateway_redirect_uri(gateway: Gateway, oidc_provider: OidcProvider) -> None:
    """Register the gateway's callback at the provider (which forgets it after every test)."""
    oidc_provider.add_redirect_uri(f"{gateway.origin}/login/callback")


def _stop(process: subprocess.Popen[Any]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# --- the example MCP server ------------------------------------------------------------


@dataclass
class WeatherServer:
    """examples/weather_server.py, registered with the gateway and serving streamable HTTP."""

    mcp_url: str
    name: str
    gateway: GatewayClient  # the gateway's API as this MCP server, for the test to look

    def elicitation_id(self, link: str) -> str:
        return urlsplit(link).path.rsplit("/", 1)[-1]


@pytest.fixture
def weather(gateway: Gateway, oidc_provider: OidcProvider, weather_port: int,
            tmp_path: Path) -> Iterator[WeatherServer]:
    """A newly registered MCP server: the example, run as docs/sdk.md says."""
    origin = f"http://127.0.0.1:{weather_port}"
    registered = gateway.run("clients", "create", f"Weather {secrets.token_hex(3)}",
                             "--webhook-url", f"{origin}/webhooks/gateway", "--json")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OIDC_"))}
    environ.update({
        "GATEWAY_URL": gateway.origin,
        "GATEWAY_API_TOKEN": registered["api_token"],
        "GATEWAY_WEBHOOK_SECRET": registered["webhook_secret"],
        "GATEWAY_CA_BUNDLE": str(gateway.certfile),
        "OIDC_ISSUER": oidc_provider.issuer,
        # The users' MCP client is the provider's second client: its ID tokens are for it.
        "OIDC_AUDIENCE": oidc_provider.other_client_id,
        "MCP_PUBLIC_URL": origin,
    })
    log = tmp_path / "weather.log"
    with log.open("w") as handle:
        process = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--port", str(weather_port)], env=environ,
            stdout=handle, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_until_listening(weather_port, process, log)
        with GatewayClient(gateway.origin, registered["api_token"],
                           verify=str(gateway.certfile)) as client:
            yield WeatherServer(f"{origin}/mcp", registered["name"], client)
    finally:
        _stop(process)


def _wait_until_listening(port: int, process: subprocess.Popen[str], log: Path) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the example server exited early:\n{log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"the example server did not start:\n{log.read_text()}")


@pytest.fixture
def token_of(oidc_provider: OidcProvider) -> Callable[[str], str]:
    """A user's ID token for their MCP client, from signing in at the provider."""
    return lambda username: oidc_provider.id_token(username,
                                                   client_id=oidc_provider.other_client_id)


# --- the browser ------------------------------------------------------------------------


@pytest.fixture(scope="package")
def browser(chromium_path: Path, gateway: Gateway) -> Iterator[Browser]:
    """Headless Chromium that accepts the gateway's self-signed certificate and no other."""
    with pinned_chromium(chromium_path, gateway.certfile) as launched:
        yield launched


@dataclass
class Problems:
    """What pages did that no test allows: CSP violations, script errors."""

    found: list[str] = field(default_factory=list)

    def console(self, message: ConsoleMessage) -> None:
        text = message.text
        # An error status (the 403 of a refused link) is reported as "Failed to load
        # resource"; the tests check statuses themselves.
        if "Content Security Policy" in text or (
                message.type == "error" and not text.startswith("Failed to load resource")):
            self.found.append(f"{message.type}: {text}")


@pytest.fixture
def new_page(browser: Browser) -> Iterator[Callable[[], Page]]:
    """Pages, each in a fresh context (its own cookies: a different person)."""
    problems = Problems()
    contexts: list[BrowserContext] = []

    def make() -> Page:
        context = browser.new_context(ignore_https_errors=False)
        context.set_default_timeout(TIMEOUT_MS)
        context.on("console", problems.console)
        context.on("weberror", lambda error: problems.found.append(str(error.error)))
        contexts.append(context)
        return context.new_page()

    yield make
    for context in contexts:
        context.close()
    assert problems.found == []


def sign_in(page: Page, provider: OidcProvider, username: str) -> None:
    """On the provider's login page (where the gateway sent the browser): sign in."""
    expect(page.locator("input[name=login]")).to_be_visible()
    assert page.url.startswith(provider.issuer + "/")
    page.locator("input[name=login]").fill(username)
    page.locator("input[name=password]").fill(provider.password)
    page.get_by_role("button", name="Sign in").click()


def enter_key(page: Page, link: str, key: str) -> None:
    """Back on the link, signed in as its owner: save the key."""
    expect(page.get_by_label("API key")).to_be_visible()
    assert page.url == link
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Save key").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Done")
