"""A scaled-out gateway: two ``gateway serve --no-worker`` instances and two ``gateway worker``s.

All four processes share one PostgreSQL database, one Redis and one
configuration (secrets, keyring, certificate, public URL), as instances
behind a load balancer do. The tests reach each instance on its own port,
where a balancer would pick one for them.

These tests need PostgreSQL (SQLite is one host's file, not something
instances on several hosts share), Redis and Debian's Chromium; without them
they skip, except on CI, where Redis and Chromium must be there and
``./dev test`` runs the suite a second time on PostgreSQL. They find and kill
processes through Linux's /proc and process descriptors.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from playwright.sync_api import Browser, BrowserContext

from gateway import db
from gateway.clock import SystemClock
from gateway.identity import service as identity
from gateway.serving.tls import make_self_signed
from tests.browser.conftest import (
    CHROMIUM,
    PASSWORD,
    TIMEOUT_MS,
    Watch,
    pinned_chromium,
)
from tests.integration.api.test_rate_limits import REDIS_URL
from tests.integration.conftest import GATEWAY, Server, tls_context
from tests.integration.webhooks.conftest import Receiver, running_receiver

# Small on purpose: a rate-limit test spends it in well under a second, and
# every other test's client (each has its own token) stays below it.
API_LIMIT = 30
# A killed worker's delivery is sent again once its claim runs out; short
# leases keep that wait inside the test. The lease must exceed three sends.
SEND_TIMEOUT_SECONDS = 2
LEASE_SECONDS = 7
# What the users see as the portal's address: the load balancer's. Nothing
# listens there in the tests; they open the same paths on each instance.
PUBLIC_URL = "https://localhost:8443"


def require(available: bool, reason: str) -> None:
    """Skip without ``available``; on CI, which must have it, fail instead."""
    if available:
        return
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="package")
def redis_url() -> str:
    """The Redis every instance counts rate limits in."""
    redis = pytest.importorskip("redis")
    try:
        reachable = bool(redis.Redis.from_url(REDIS_URL, socket_timeout=2).ping())
    except redis.RedisError:
        reachable = False
    require(reachable, f"Redis is not reachable at {REDIS_URL}: the scale-out tests share "
                       "rate limits through it")
    return REDIS_URL


@pytest.fixture(scope="package")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One certificate and key for localhost, served by every instance."""
    folder = tmp_path_factory.mktemp("scale-out-tls")
    certfile, keyfile = folder / "cert.pem", folder / "key.pem"
    cert, key = make_self_signed(("localhost",), ("127.0.0.1",))
    certfile.write_bytes(cert)
    keyfile.write_bytes(key)
    keyfile.chmod(0o600)
    return certfile, keyfile


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """The MCP server's webhook endpoint, on loopback over plain http."""
    with running_receiver() as started:
        yield started


@pytest.fixture
def base_environ(base_environ: dict[str, str], redis_url: str, receiver: Receiver,
                 certificate: tuple[Path, Path]) -> dict[str, str]:
    """The one configuration every process of the deployment runs with."""
    certfile, keyfile = certificate
    return {
        **base_environ,
        "GATEWAY_LOGIN_BACKEND": "local",
        "GATEWAY_RATELIMIT_STORAGE_URL": redis_url,
        "GATEWAY_RATELIMIT_API": f"{API_LIMIT}/minute",
        "GATEWAY_TLS_CERTFILE": str(certfile),
        "GATEWAY_TLS_KEYFILE": str(keyfile),
        "GATEWAY_WEBHOOK_SEND_TIMEOUT_SECONDS": str(SEND_TIMEOUT_SECONDS),
        "GATEWAY_WEBHOOK_LEASE_SECONDS": str(LEASE_SECONDS),
        # Exactly the receiver's host and port may be reached over http on loopback.
        "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": receiver.host,
    }


@pytest.fixture
def cli_environ(cli_environ: dict[str, str]) -> dict[str, str]:
    """The environment of every process: the balancer's address is the public URL."""
    return {**cli_environ, "GATEWAY_PUBLIC_URL": PUBLIC_URL}


# --- the instances ---------------------------------------------------------------------


@dataclass
class Reply:
    """An API response: status, headers and the JSON body."""

    status: int
    headers: Message
    body: Any


@dataclass
class Instance:
    """One ``gateway serve --no-worker``, reached directly on its port."""

    name: str
    server: Server
    certfile: Path

    @property
    def origin(self) -> str:
        return f"https://localhost:{self.server.port}"

    def url(self, path: str) -> str:
        return self.origin + path

    def api(self, method: str, path: str, token: str, payload: Any = None,
            timeout: float = 10) -> Reply:
        """Call the JSON API over TLS as the holder of ``token``."""
        connection = http.client.HTTPSConnection("localhost", self.server.port, timeout=timeout,
                                                 context=tls_context(self.certfile))
        try:
            connection.request(method, path, body=None if payload is None else json.dumps(payload),
                               headers={"Authorization": f"Bearer {token}",
                                        "Content-Type": "application/json"})
            response = connection.getresponse()
            raw = response.read()
        finally:
            connection.close()
        return Reply(response.status, response.headers, json.loads(raw) if raw else None)

    def kill(self) -> None:
        """SIGKILL the gunicorn master and its worker: the instance is gone at once."""
        kill_tree(self.server.process.pid)
        self.server.process.wait(timeout=10)


@dataclass
class Instances:
    """Instances A and B of one deployment."""

    a: Instance
    b: Instance


@pytest.fixture
def instances(start_server: Callable[..., Server],
              certificate: tuple[Path, Path]) -> Iterator[Instances]:
    """Two instances serving requests only, started side by side; both stopped afterwards."""
    certfile, _ = certificate
    with ThreadPoolExecutor(2) as pool:
        servers = list(pool.map(lambda _: start_server("--no-worker"), range(2)))
    yield Instances(*(Instance(name, server, certfile)
                      for name, server in zip("AB", servers, strict=True)))
    # start_server stops them too, one after the other; both at once is quicker.
    _stop([server.process for server in servers])


# --- the workers -----------------------------------------------------------------------


@dataclass
class Worker:
    """One ``gateway worker`` process."""

    process: subprocess.Popen[str]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        return self.log.read_text()

    def kill(self) -> None:
        """SIGKILL: no chance to finish a send or record it."""
        os.kill(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)


@pytest.fixture
def launched_workers(cli_environ: dict[str, str], tmp_path: Path) -> Iterator[list[Worker]]:
    """Two ``gateway worker`` processes, launched but perhaps not up yet; stopped afterwards."""
    launched: list[Worker] = []
    try:
        for number in (1, 2):
            log = tmp_path / f"worker-{number}.log"
            with log.open("w") as handle:
                process = subprocess.Popen([*GATEWAY, "worker"], env=cli_environ, cwd=tmp_path,
                                           stdout=handle, stderr=subprocess.STDOUT, text=True)
            launched.append(Worker(process, log))
        yield launched
    finally:
        _stop([worker.process for worker in launched])


def _wait_until_started(worker: Worker, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker.process.poll() is not None:
            raise AssertionError(f"gateway worker exited early:\n{worker.output()}")
        if "worker started" in worker.output():
            return
        time.sleep(0.1)
    raise AssertionError(f"gateway worker did not start:\n{worker.output()}")


@dataclass
class Deployment:
    """The whole deployment: instances A and B, and two workers sharing the outbox."""

    a: Instance
    b: Instance
    workers: list[Worker]


@pytest.fixture
def deployment(launched_workers: list[Worker], instances: Instances) -> Iterator[Deployment]:
    """Instances and workers, all up (the workers start while the instances do); all stopped."""
    for worker in launched_workers:
        _wait_until_started(worker)
    yield Deployment(instances.a, instances.b, launched_workers)
    _stop([instances.a.server.process, instances.b.server.process,
           *(worker.process for worker in launched_workers)])


def _stop(processes: list[subprocess.Popen[str]]) -> None:
    """Ask every process to stop, then wait for all of them (killing any that hang)."""
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --- processes, as Linux shows them ------------------------------------------------------


def kill_tree(pid: int, timeout: float = 10) -> None:
    """SIGKILL a process and all its descendants; return once every one has exited."""
    handles: list[int] = []
    try:
        # The parent first: a gunicorn master would replace a worker killed before it.
        for member in _family(pid):
            with contextlib.suppress(ProcessLookupError):  # gone already
                handles.append(os.pidfd_open(member))
        for handle in handles:
            signal.pidfd_send_signal(handle, signal.SIGKILL)
        for handle in handles:
            # A process descriptor becomes readable when its process has exited,
            # which is when the kernel has closed its sockets.
            exited, _, _ = select.select([handle], [], [], timeout)
            assert exited, f"a process of {pid} still runs {timeout} s after SIGKILL"
    finally:
        for handle in handles:
            os.close(handle)


def _family(pid: int) -> list[int]:
    """The process and its descendants, parents before children."""
    try:
        listed = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        listed = ""
    return [pid, *(member for child in listed.split() for member in _family(int(child)))]


def owner_of_port(port: int, pids: list[int]) -> int | None:
    """Which of ``pids`` has the IPv4 TCP socket whose local port is ``port``."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port:
            inodes.add(f"socket:[{fields[9]}]")
    for pid in pids:
        for descriptor in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(descriptor) in inodes:
                    return pid
            except FileNotFoundError:
                continue  # closed while we looked
    return None


# --- users and their browser --------------------------------------------------------------


@pytest.fixture
def create_user(app: Flask) -> Callable[[], str]:
    """A new local account with the browser tests' password; its user name."""

    def create() -> str:
        username = f"ada.{secrets.token_hex(3)}"
        with app.app_context(), db.transaction() as session:
            identity.create_user(session, SystemClock(), username=username, password=PASSWORD,
                                 actor="test")
        return username

    return create


@pytest.fixture(scope="package")
def browser(certificate: tuple[Path, Path]) -> Iterator[Browser]:
    """Headless Chromium trusting exactly the deployment's certificate (as tests/browser)."""
    require(CHROMIUM.is_file(), f"{CHROMIUM} is missing: the scale-out tests log in with "
                                "Debian's chromium (`apt-get install chromium`)")
    certfile, _ = certificate
    with pinned_chromium(CHROMIUM, certfile) as launched:
        yield launched


@pytest.fixture
def context(browser: Browser, instances: Instances) -> Iterator[BrowserContext]:
    """One user's browser, watched: no CSP violation, script error or request elsewhere."""
    watch = Watch(f"localhost:{instances.b.server.port}")
    watch.expect_origin(instances.a.origin)
    opened = browser.new_context(ignore_https_errors=False)
    opened.set_default_timeout(TIMEOUT_MS)
    opened.set_default_navigation_timeout(TIMEOUT_MS)
    opened.on("console", watch.console)
    opened.on("weberror", watch.page_error)
    opened.on("request", watch.request)
    opened.on("response", watch.response)
    yield opened
    opened.close()
    assert watch.problems == [], "\n".join([*watch.problems, "console:", *watch.messages])


# --- long-polls -----------------------------------------------------------------------------


class LongPoll(threading.Thread):
    """``GET /api/v1/elicitations/{id}?wait=N`` held in the background."""

    def __init__(self, instance: Instance, token: str, elicitation_id: str,
                 wait: int = 30) -> None:
        super().__init__(daemon=True)
        self.instance, self.token = instance, token
        self.path = f"/api/v1/elicitations/{elicitation_id}?wait={wait}"
        self.timeout = wait + 10
        self.reply: Reply | None = None
        self.returned_at = 0.0  # time.monotonic()

    def run(self) -> None:
        self.reply = self.instance.api("GET", self.path, self.token, timeout=self.timeout)
        self.returned_at = time.monotonic()
