"""Debian's nginx, configured by docs/deployment/nginx.conf, in front of real gateway instances.

The documented file is the configuration: the test replaces only its example
values (ports, name, certificate, upstream addresses, log path), each of
which must appear in it exactly once, and adds ``proxy_bind 127.0.0.3``:
nginx then reaches the instances from 127.0.0.3 while the browser and the
API calls reach nginx from 127.0.0.1, so an audit row shows whose address
the gateway took. A small main configuration around it keeps every path nginx
writes (pid, logs, temporary files) in a folder of the test's own.

nginx runs as an unprivileged user: the test's own, or ``nobody`` when the
tests run as root (as CI does). Without /usr/sbin/nginx these tests skip,
except on CI, where ``./dev test`` installs it and they must run.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext

from gateway.serving.tls import make_self_signed
from tests.browser.conftest import CHROMIUM, TIMEOUT_MS, Watch, pinned_chromium
from tests.integration.conftest import Server, free_port
from tests.integration.scale_out.conftest import (  # noqa: F401  (create_user: a fixture)
    create_user,
    require,
)

NGINX = Path("/usr/sbin/nginx")
DOCUMENTED = Path(__file__).resolve().parents[3] / "docs" / "deployment" / "nginx.conf"
# Where nginx connects to the instances from; the clients connect from 127.0.0.1.
PROXY_ADDRESS = "127.0.0.3"
# Written into X-Forwarded-For by the browser itself: never to be believed.
FORGED_ADDRESS = "203.0.113.66"

MAIN_CONFIGURATION = """\
# The parts of Debian's /etc/nginx/nginx.conf an unprivileged nginx needs,
# with every file it writes in {folder}.
daemon off;
worker_processes 1;
pid {folder}/nginx.pid;
error_log {folder}/error.log notice;
events {{
    worker_connections 256;
}}
http {{
    client_body_temp_path {folder}/client_body;
    proxy_temp_path {folder}/proxy;
    fastcgi_temp_path {folder}/fastcgi;
    uwsgi_temp_path {folder}/uwsgi;
    scgi_temp_path {folder}/scgi;
    access_log off;
    include {folder}/gateway.conf;
}}
"""


# --- the documented configuration, made runnable -------------------------------------------


@dataclass(frozen=True)
class Site:
    """What the test puts in place of the documented file's example values."""

    https_port: int
    http_port: int
    certfile: Path
    keyfile: Path
    upstreams: tuple[int, ...]
    access_log: Path
    # proxy_set_header lines to leave out, as a misconfigured nginx would.
    omit_headers: tuple[str, ...] = ()


def _replace_once(text: str, old: str, new: str) -> str:
    found = text.count(old)
    assert found == 1, f"{DOCUMENTED.name} has {found} times {old!r}, where the test expects one"
    return text.replace(old, new)


def render(documented: str, site: Site) -> str:
    """The documented configuration with the test's values in place of its examples."""
    text = documented
    for example, ours in [
        ("    listen 443 ssl http2;\n", f"    listen 127.0.0.1:{site.https_port} ssl http2;\n"),
        ("    listen [::]:443 ssl http2;\n", ""),
        ("    listen 80;\n", f"    listen 127.0.0.1:{site.http_port};\n"),
        ("    listen [::]:80;\n", ""),
        ("server_name portal.example.com;", "server_name localhost;"),
        ("/etc/ssl/certs/portal.example.com.fullchain.pem", str(site.certfile)),
        ("/etc/ssl/private/portal.example.com.key", str(site.keyfile)),
        ("    server 127.0.0.1:8080;\n",
         "".join(f"    server 127.0.0.1:{port};\n" for port in site.upstreams)),
        ("/var/log/nginx/gateway.access.log", str(site.access_log)),
        ("        proxy_pass http://gateway;\n",
         f"        proxy_pass http://gateway;\n        proxy_bind {PROXY_ADDRESS};\n"),
    ]:
        text = _replace_once(text, example, ours)
    for header in site.omit_headers:
        text, found = re.subn(rf"^ *proxy_set_header {re.escape(header)} .*;\n", "", text,
                              flags=re.MULTILINE)
        assert found == 1, f"{DOCUMENTED.name} does not set {header} exactly once"
    return text


# --- nginx ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    """The ports nginx listens on, chosen before the gateway learns its public URL."""

    https_port: int
    http_port: int

    @property
    def origin(self) -> str:
        return f"https://localhost:{self.https_port}"


@dataclass
class Nginx:
    """A running nginx and the files it writes."""

    process: subprocess.Popen[bytes]
    folder: Path

    @property
    def access_log(self) -> Path:
        return self.folder / "access.log"

    def errors(self) -> str:
        return "".join(path.read_text() for path in (self.folder / "stderr.log",
                                                      self.folder / "error.log")
                       if path.exists())


@pytest.fixture(scope="package")
def nginx_binary() -> Path:
    """Debian's nginx; ``./dev test`` installs it. CI must have it, locally we skip."""
    require(NGINX.is_file(), f"{NGINX} is missing: the nginx deployment tests run Debian's "
                             "nginx (`apt-get install nginx`, which ./dev test does when it may)")
    return NGINX


@pytest.fixture(scope="package")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate and key for localhost, as nginx presents it."""
    folder = tmp_path_factory.mktemp("nginx-tls")
    certfile, keyfile = folder / "cert.pem", folder / "key.pem"
    cert, key = make_self_signed(("localhost",), ("127.0.0.1",))
    certfile.write_bytes(cert)
    keyfile.write_bytes(key)
    keyfile.chmod(0o600)
    return certfile, keyfile


@pytest.fixture
def edge() -> Edge:
    """Two free ports for nginx: https and plain http."""
    https_port = free_port()
    while (http_port := free_port()) == https_port:
        pass
    return Edge(https_port, http_port)


@pytest.fixture
def cli_environ(cli_environ: dict[str, str], edge: Edge) -> dict[str, str]:
    """Every instance's environment: nginx's origin is the public URL, one proxy hop trusted."""
    return {**cli_environ, "GATEWAY_PUBLIC_URL": edge.origin, "GATEWAY_PROXY_HOPS": "1",
            "GATEWAY_LOGIN_BACKEND": "local"}


def _unprivileged() -> pwd.struct_passwd | None:
    """The user nginx runs as when the tests run as root; None to run it as ourselves."""
    return pwd.getpwnam("nobody") if os.geteuid() == 0 else None


@pytest.fixture
def start_nginx(nginx_binary: Path, certificate: tuple[Path, Path],
                edge: Edge) -> Iterator[Callable[..., Nginx]]:
    """Start nginx with the documented configuration in front of instances; stop it afterwards."""
    started: list[Nginx] = []
    user = _unprivileged()

    def start(upstreams: list[int], omit_headers: tuple[str, ...] = ()) -> Nginx:
        # Not under pytest's tmp_path, whose parents only root may enter.
        folder = Path(tempfile.mkdtemp(prefix="gateway-nginx-"))
        certfile, keyfile = (Path(shutil.copy(path, folder)) for path in certificate)
        site = Site(edge.https_port, edge.http_port, certfile, keyfile, tuple(upstreams),
                    folder / "access.log", omit_headers)
        (folder / "gateway.conf").write_text(render(DOCUMENTED.read_text(), site))
        (folder / "nginx.conf").write_text(MAIN_CONFIGURATION.format(folder=folder))
        if user is not None:
            for path in (folder, *folder.iterdir()):
                os.chown(path, user.pw_uid, user.pw_gid)
        as_user: dict[str, Any] = {} if user is None else {
            "user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        with (folder / "stderr.log").open("wb") as stderr:
            process = subprocess.Popen(
                [str(nginx_binary), "-c", str(folder / "nginx.conf"), "-p", str(folder),
                 "-e", str(folder / "error.log")],
                stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, **as_user)
        nginx = Nginx(process, folder)
        started.append(nginx)
        _wait_until_listening(nginx, edge.https_port)
        return nginx

    yield start
    for nginx in started:
        nginx.process.terminate()
        try:
            nginx.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            nginx.process.kill()
            nginx.process.wait()
        shutil.rmtree(nginx.folder, ignore_errors=True)


def _wait_until_listening(nginx: Nginx, port: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if nginx.process.poll() is not None:
            raise AssertionError(f"nginx exited early:\n{nginx.errors()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nginx did not start:\n{nginx.errors()}")


# --- the gateway behind it ----------------------------------------------------------------


@pytest.fixture
def start_instances(start_server: Callable[..., Server]) -> Callable[[int], list[Server]]:
    """Start ``gateway serve --no-worker --no-tls`` instances side by side, as behind nginx."""

    def start(count: int) -> list[Server]:
        with ThreadPoolExecutor(count) as pool:
            return list(pool.map(lambda _: start_server("--no-worker", "--no-tls"),
                                 range(count)))

    return start


# --- the browser ------------------------------------------------------------------------------


@pytest.fixture(scope="package")
def browser(certificate: tuple[Path, Path]) -> Iterator[Browser]:
    """Headless Chromium trusting exactly nginx's certificate (as tests/browser)."""
    require(CHROMIUM.is_file(), f"{CHROMIUM} is missing: the nginx deployment test logs in "
                                "with Debian's chromium (`apt-get install chromium`)")
    certfile, _ = certificate
    with pinned_chromium(CHROMIUM, certfile) as launched:
        yield launched


@pytest.fixture
def context(browser: Browser, edge: Edge) -> Iterator[BrowserContext]:
    """One user's browser, watched, that writes a forged X-Forwarded-For on every request."""
    watch = Watch(f"localhost:{edge.https_port}")
    opened = browser.new_context(ignore_https_errors=False,
                                 extra_http_headers={"X-Forwarded-For": FORGED_ADDRESS})
    opened.set_default_timeout(TIMEOUT_MS)
    opened.set_default_navigation_timeout(TIMEOUT_MS)
    opened.on("console", watch.console)
    opened.on("weberror", watch.page_error)
    opened.on("request", watch.request)
    opened.on("response", watch.response)
    yield opened
    opened.close()
    assert watch.problems == [], "\n".join([*watch.problems, "console:", *watch.messages])
