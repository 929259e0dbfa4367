"""Real-browser fixtures: Debian's Chromium, driven by Playwright, against ``gateway serve``.

The browser tests share one gateway (the real ``gateway serve`` over TLS
with its self-signed development certificate, local login backend) and one
headless Chromium that trusts exactly that certificate; the database is
emptied when they are done. Each test gets fresh browser contexts (their
own cookies) and its own elicitations, so tests do not see each other's
sessions or requests.

Every page a test opens is watched: a Content-Security-Policy violation, a
JavaScript error or a request to any host but the gateway fails the test,
unless the test named that origin (a stand-in it answers itself, or a
server of the tests on loopback, such as the identity provider).

The connection tests need a provider in the catalog; they get a second
gateway, ``oauth_gateway``, so that the others run without one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Page,
    Request,
    Response,
    WebError,
    expect,
    sync_playwright,
)
from sqlalchemy import update

from gateway import db, resources
from gateway.elicitations.models import Elicitation
from gateway.serving.tls import dev_certificate_paths
from tests.browser.stripe_stub import StripeStub, running_stub
from tests.conftest import _empty_tables, gateway_environ, process_environ
from tests.integration.conftest import free_port, tls_context
from tests.oidc.fixtures import OidcProvider

CHROMIUM = Path("/usr/bin/chromium")
# Headless, and nothing Chromium would fetch or start on its own.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PASSWORD = "correct horse battery staple"
# Where the tests' own servers listen; the browser may visit those it is told of.
LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
# Generous for a cold Chromium, short enough that a hang fails fast.
TIMEOUT_MS = 15_000

GATEWAY = [sys.executable, "-m", "gateway"]

expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture(scope="package")
def chromium_path() -> Path:
    """Debian's Chromium; ``./dev test`` installs it. CI must have it, locally we skip."""
    if not CHROMIUM.is_file():
        reason = (f"{CHROMIUM} is missing: the browser tests need Debian's chromium "
                  "(`apt-get install chromium`, which ./dev test does when it may)")
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return CHROMIUM


# --- the gateway ---------------------------------------------------------------------


@dataclass
class ApiAnswer:
    status: int
    body: Any


@dataclass
class Gateway:
    """A running ``gateway serve`` and what the tests do to it from outside the browser."""

    origin: str
    environ: dict[str, str]
    workdir: Path
    certfile: Path
    process: subprocess.Popen[str]
    log: Path
    stripe: StripeStub
    api_token: str = ""
    client_name: str = ""

    def url(self, path: str) -> str:
        return self.origin + path

    @property
    def host(self) -> str:
        return urlsplit(self.origin).netloc

    def command(self, *args: str) -> subprocess.Popen[str]:
        """Start a gateway command against this instance."""
        process = subprocess.Popen([*GATEWAY, *args], env=self.environ, cwd=self.workdir,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        return process

    def run(self, *args: str, stdin: str = "") -> Any:
        """Run a gateway command against this instance; its JSON output."""
        return _json_of(self.command(*args), stdin)

    def create_users(self, *prefixes: str) -> list[str]:
        """New local accounts with the test password (created side by side); their names."""
        names = [f"{prefix}.{secrets.token_hex(3)}" for prefix in prefixes]
        running = [self.command("users", "create", name, "--password-stdin", "--json")
                   for name in names]
        for name, process in zip(names, running, strict=True):
            created = _json_of(process, PASSWORD + "\n")
            assert created["subject"] == {"iss": self.origin, "sub": name}
        return names

    def create_user(self, prefix: str) -> str:
        [username] = self.create_users(prefix)
        return username

    def api(self, method: str, path: str, body: Any = None) -> ApiAnswer:
        """Call the JSON API over HTTPS as the registered MCP server."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url(path), data=data, method=method, headers={
            "Authorization": f"Bearer {self.api_token}", "Content-Type": "application/json",
            "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, context=tls_context(self.certfile),
                                        timeout=30) as response:
                return ApiAnswer(response.status, json.loads(response.read() or b"null"))
        except urllib.error.HTTPError as error:
            with error:
                return ApiAnswer(error.code, json.loads(error.read() or b"null"))

    def ask_for_key(self, username: str, message: str) -> dict[str, Any]:
        """An API-key elicitation for ``username``, as their MCP server creates it."""
        created = self.api("POST", "/api/v1/elicitations", {
            "subject": {"iss": self.origin, "sub": username}, "kind": "api_key",
            "credential_type": "generic", "message": message, "reuse_pending": False})
        assert created.status == 201, created.body
        elicitation: dict[str, Any] = created.body
        return elicitation

    def ask_for_payment(self, username: str, message: str,
                        payment: dict[str, Any]) -> dict[str, Any]:
        """A payment elicitation for ``username``, as their MCP server creates it."""
        created = self.api("POST", "/api/v1/elicitations", {
            "subject": {"iss": self.origin, "sub": username}, "kind": "payment",
            "message": message, "payment": payment, "reuse_pending": False})
        assert created.status == 201, created.body
        elicitation: dict[str, Any] = created.body
        return elicitation

    def ask_to_connect(self, username: str, message: str, credential_type: str,
                       **fields: Any) -> dict[str, Any]:
        """An OAuth elicitation for ``username``: connect their account of ``credential_type``."""
        created = self.api("POST", "/api/v1/elicitations", {
            "subject": {"iss": self.origin, "sub": username}, "kind": "oauth",
            "credential_type": credential_type, "message": message, "reuse_pending": False,
            **fields})
        assert created.status == 201, created.body
        elicitation: dict[str, Any] = created.body
        return elicitation

    def status_of(self, elicitation_id: str) -> str:
        answer = self.api("GET", f"/api/v1/elicitations/{elicitation_id}")
        assert answer.status == 200, answer.body
        status: str = answer.body["status"]
        return status

    def run_out_of_time(self, elicitation_id: str) -> None:
        """Move a link's expiry into the past: the running server's clock cannot be advanced."""
        engine = db.make_engine(self.environ["GATEWAY_DATABASE_URL"])
        try:
            with engine.begin() as connection:
                connection.execute(update(Elicitation).where(Elicitation.id == elicitation_id)
                                   .values(expires_at=datetime.now(UTC) - timedelta(minutes=1)))
        finally:
            engine.dispose()


def _json_of(process: subprocess.Popen[str], stdin: str = "") -> Any:
    stdout, stderr = process.communicate(stdin, timeout=60)
    assert process.returncode == 0, stderr
    return json.loads(stdout)


@pytest.fixture(scope="package")
def stripe_stub() -> Iterator[StripeStub]:
    """Stripe's API, simulated on loopback for the gateway under test."""
    with running_stub() as stub:
        yield stub


@pytest.fixture(scope="package")
def gateway(chromium_path: Path, database_url: str, stripe_stub: StripeStub,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """``gateway serve`` on a free port, with one registered MCP server (client).

    It takes payments against the Stripe stub, which it may reach over plain
    http on loopback because the stub's address is listed as a development host.
    """
    workdir = tmp_path_factory.mktemp("browser-gateway")
    instance = workdir / "instance"
    instance.mkdir(mode=0o700)
    port = free_port()
    origin = f"https://localhost:{port}"
    # Links are built from the origin and every request's Host is checked against it.
    environ = process_environ(gateway_environ(instance, database_url, origin))
    environ.update({
        "GATEWAY_LOGIN_BACKEND": "local",
        # Every accessibility tour shows the failed-login page once, all from one address.
        "GATEWAY_RATELIMIT_LOGIN": "100 per 15 minutes",
        "GATEWAY_STRIPE_SECRET_KEY": "sk_test_browser_" + "s" * 24,
        "GATEWAY_STRIPE_WEBHOOK_SECRET": "whsec_test_browser_" + "w" * 24,
        "GATEWAY_STRIPE_API_BASE": stripe_stub.origin,
        "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": f"127.0.0.1:{stripe_stub.port}",
    })
    log = workdir / "serve.log"
    with log.open("w") as handle:
        process = subprocess.Popen(
            [*GATEWAY, "serve", "--port", str(port), "--workers", "1"],
            env=environ, cwd=workdir, stdout=handle, stderr=subprocess.STDOUT, text=True)
    certfile, _ = dev_certificate_paths(instance)
    server = Gateway(origin, environ, workdir, certfile, process, log, stripe_stub)
    try:
        _wait_until_healthy(server)
        client = server.run("clients", "create", "Weather Forecasts", "--json")
        server.api_token, server.client_name = client["api_token"], client["name"]
        yield server
    finally:
        _stop(process)
        # Leave the run's database empty, as every other test does.
        engine = db.make_engine(database_url)
        try:
            _empty_tables(engine)
        finally:
            engine.dispose()


@contextmanager
def serve_alongside(gateway: Gateway, name: str, settings: Mapping[str, str], *,
                    also_reach: Sequence[str] = ()) -> Iterator[Gateway]:
    """A second ``gateway serve`` on the first one's database, with ``settings`` changed.

    It has an origin of its own and serves the first one's certificate, which
    the browser already trusts; it runs no outbox worker (the first one
    delivers for both). ``also_reach`` lists plain-http development hosts
    (``host:port``) it may reach besides those the first one may.
    """
    port = free_port()
    origin = f"https://localhost:{port}"
    insecure = filter(None, (gateway.environ.get("GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS"),
                             *also_reach))
    environ = {**gateway.environ, "GATEWAY_PUBLIC_URL": origin, **settings,
               "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": ",".join(insecure)}
    certfile, keyfile = dev_certificate_paths(gateway.workdir / "instance")
    log = gateway.workdir / f"serve-{name}.log"
    with log.open("w") as handle:
        process = subprocess.Popen(
            [*GATEWAY, "serve", "--port", str(port), "--workers", "1",
             "--certfile", str(certfile), "--keyfile", str(keyfile), "--no-worker"],
            env=environ, cwd=gateway.workdir, stdout=handle, stderr=subprocess.STDOUT,
            text=True)
    server = replace(gateway, origin=origin, environ=environ, process=process, log=log)
    try:
        _wait_until_healthy(server)
        yield server
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _wait_until_healthy(server: Gateway, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise AssertionError(f"gateway serve exited early:\n{server.log.read_text()}")
        if server.certfile.exists():
            try:
                with urllib.request.urlopen(server.url("/healthz"), timeout=2,
                                            context=tls_context(server.certfile)) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
        time.sleep(0.1)
    raise AssertionError(f"gateway serve did not start:\n{server.log.read_text()}")


# --- the browser ------------------------------------------------------------------------


def spki_digest(certfile: Path) -> str:
    """Base64 SHA-256 of the certificate's public key, as Chromium's SPKI list wants it."""
    certificate = x509.load_pem_x509_certificate(certfile.read_bytes())
    spki = certificate.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


@pytest.fixture(scope="package")
def browser(chromium_path: Path, gateway: Gateway) -> Iterator[Browser]:
    """Headless Chromium that accepts the gateway's self-signed certificate and no other."""
    with pinned_chromium(chromium_path, gateway.certfile) as launched:
        yield launched


@contextmanager
def pinned_chromium(chromium_path: Path, certfile: Path) -> Iterator[Browser]:
    """Headless Chromium that accepts the certificate in ``certfile`` and no other.

    ``--ignore-certificate-errors-spki-list`` pins exactly that key, so TLS is
    still checked for every other certificate and the contexts keep
    ``ignore_https_errors=False``.
    """
    pin = f"--ignore-certificate-errors-spki-list={spki_digest(certfile)}"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(chromium_path), headless=True, args=[*CHROMIUM_FLAGS, pin])
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Watch:
    """What the pages of one browser context did that a test must not allow."""

    host: str
    problems: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    # Origins a test expects the browser to be sent to (and answers itself
    # with page.route, so nothing leaves the machine).
    expected_origins: set[str] = field(default_factory=set)
    # Servers the tests run on loopback that the browser really visits (the
    # test identity provider's login page): nothing leaves the machine either.
    local_servers: set[str] = field(default_factory=set)

    def expect_origin(self, origin: str) -> None:
        """Let requests to ``origin`` pass: the test routes them to a stand-in."""
        self.expected_origins.add(origin)

    def allow_local_server(self, origin: str) -> None:
        """Let requests to ``origin`` pass: a server of the tests, on a loopback address.

        Only an exact origin (scheme, loopback host, port) is taken, so the
        rest of the machine and the outside world stay forbidden.
        """
        parts = urlsplit(origin)
        if (parts.hostname not in LOOPBACK or parts.port is None
                or origin != f"{parts.scheme}://{parts.netloc}"):
            raise ValueError(f"{origin!r} is not the origin of a server on loopback")
        self.local_servers.add(origin)

    def console(self, message: ConsoleMessage) -> None:
        text = message.text
        self.messages.append(f"{message.type}: {text}")
        if "Content Security Policy" in text or "Content-Security-Policy" in text:
            self.problems.append(f"CSP violation: {text}")
        elif message.type == "error" and not text.startswith("Failed to load resource"):
            # Error statuses (a 403 page, say) are reported as "Failed to load
            # resource"; tests check those statuses themselves.
            self.problems.append(f"console error: {text}")

    def page_error(self, error: WebError) -> None:
        self.problems.append(f"JavaScript error: {error.error}")

    def response(self, response: Response) -> None:
        # A page's own status is the test's business; a sub-resource must load.
        if response.request.resource_type != "document" and response.status >= 400:
            self.problems.append(f"{response.status} for {response.url}")

    def request(self, request: Request) -> None:
        self.requests.append(request.url)
        parts = urlsplit(request.url)
        origin = f"{parts.scheme}://{parts.netloc}"
        if origin in self.expected_origins or origin in self.local_servers:
            return
        if parts.scheme != "https" or parts.netloc != self.host:
            self.problems.append(f"request to another origin: {request.url}")


@pytest.fixture
def watch(gateway: Gateway) -> Watch:
    return Watch(gateway.host)


@pytest.fixture
def new_context(browser: Browser, watch: Watch) -> Iterator[Callable[..., BrowserContext]]:
    """New browser contexts (own cookies), watched; closed and checked after the test."""
    with watched_contexts(browser, watch) as make:
        yield make


@contextmanager
def watched_contexts(browser: Browser,
                     watch: Watch) -> Iterator[Callable[..., BrowserContext]]:
    """Make browser contexts that report to ``watch``; close them and check it at the end."""
    contexts: list[BrowserContext] = []

    def make(**options: Any) -> BrowserContext:
        context = browser.new_context(ignore_https_errors=False, **options)
        context.set_default_timeout(TIMEOUT_MS)
        context.set_default_navigation_timeout(TIMEOUT_MS)
        context.on("console", watch.console)
        context.on("weberror", watch.page_error)
        context.on("request", watch.request)
        context.on("response", watch.response)
        contexts.append(context)
        return context

    try:
        yield make
    finally:
        for context in contexts:
            context.close()
    assert watch.problems == [], "\n".join(
        [*watch.problems, "console:", *watch.messages])


@pytest.fixture
def page(new_context: Callable[..., BrowserContext]) -> Page:
    """A page in a fresh context."""
    return new_context().new_page()


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    """Where a test writes screenshots (a temporary folder, never the repository)."""
    folder = tmp_path / "screenshots"
    folder.mkdir()
    return folder


# The README's pictures of the portal: small, and the same size on every machine.
SCREENSHOTS_ENV = "GATEWAY_SCREENSHOTS"
SCREENSHOT_VIEWPORT = {"width": 1000, "height": 760}


@dataclass(frozen=True)
class Screenshot:
    """Saves ``<folder>/<name>.png`` of a page, or does nothing when no folder is set."""

    folder: Path | None

    def __call__(self, page: Page, name: str) -> None:
        if self.folder is None:
            return
        # Contexts are made at scale 1 (Playwright's default), so one CSS
        # pixel is one image pixel; the width is fixed here, the height is the page's.
        page.set_viewport_size(SCREENSHOT_VIEWPORT)
        page.screenshot(path=self.folder / f"{name}.png", full_page=True,
                        animations="disabled", caret="hide")


@pytest.fixture(scope="session")
def screenshot() -> Screenshot:
    """``screenshot(page, "capture")``: the README's picture of a page, when asked for.

    ``GATEWAY_SCREENSHOTS=docs/screenshots`` turns it on (the pictures in the
    README are made that way); unset, as in CI, it does nothing.
    """
    folder = os.environ.get(SCREENSHOTS_ENV)
    if not folder:
        return Screenshot(None)
    path = Path(folder).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return Screenshot(path)


def log_in(page: Page, username: str, password: str = PASSWORD) -> None:
    """Fill in and send the login form the page shows; wait for where it leads."""
    page.get_by_label("User name").fill(username)
    page.get_by_label("Password").fill(password)
    with page.expect_navigation():
        page.get_by_role("button", name="Log in").click()


# --- connections (OAuth) -----------------------------------------------------------------

# The third-party account the OAuth gateway's catalog adds: the test provider
# (tests/oidc) plays the service, its client connect-app is the registration.
CONNECTION_TYPE = "example"
CONNECT_SECRET_ENV = "TEST_CONNECT_CLIENT_SECRET"


def connection_catalog(provider: OidcProvider) -> str:
    """The shipped catalog, and an OAuth type at ``provider`` after it."""
    shipped = (resources.CONFIG / "credential_types.toml").read_text()
    return shipped + textwrap.dedent(f"""
        [{CONNECTION_TYPE}]
        label = "Example account"
        kind = "oauth"
        help = "Your Example account holds your repositories and their issues."

        [{CONNECTION_TYPE}.oauth]
        issuer = "{provider.issuer}"
        client_id = "{provider.connect_client_id}"
        client_secret_env = "{CONNECT_SECRET_ENV}"
        scopes = ["openid", "profile", "repo"]
        account_field = "preferred_username"
        """)


@pytest.fixture(scope="package")
def oauth_gateway(gateway: Gateway, oidc_provider: OidcProvider) -> Iterator[Gateway]:
    """A second gateway whose catalog has an OAuth type at the test provider.

    Served beside the shared one so that the other browser tests need no
    provider (and no Node.js): only the tests that connect accounts start it.
    """
    catalog = gateway.workdir / "credential_types.toml"
    catalog.write_text(connection_catalog(oidc_provider))
    settings = {"GATEWAY_CREDENTIAL_TYPES_FILE": str(catalog),
                CONNECT_SECRET_ENV: oidc_provider.connect_client_secret}
    # The provider listens on loopback over plain http, which the gateway refuses unless told.
    with serve_alongside(gateway, "oauth", settings,
                         also_reach=[urlsplit(oidc_provider.issuer).netloc]) as server:
        yield server


@pytest.fixture
def connect_app(oauth_gateway: Gateway, oidc_provider: OidcProvider) -> OidcProvider:
    """The provider, with the OAuth gateway's callback registered for connect-app.

    Registered for each test: the provider forgets it when it is reset after one.
    """
    oidc_provider.add_connect_redirect_uri(
        oauth_gateway.url(f"/oauth/callback/{CONNECTION_TYPE}"))
    return oidc_provider


@pytest.fixture
def oauth_watch(oauth_gateway: Gateway, connect_app: OidcProvider) -> Watch:
    """The watch for pages of the OAuth gateway: the provider's pages may be visited too."""
    watch = Watch(oauth_gateway.host)
    watch.allow_local_server(connect_app.issuer)
    return watch


@pytest.fixture
def oauth_context(browser: Browser,
                  oauth_watch: Watch) -> Iterator[Callable[..., BrowserContext]]:
    """New browser contexts for the OAuth gateway and the provider, watched as ``new_context``."""
    with watched_contexts(browser, oauth_watch) as make:
        yield make
