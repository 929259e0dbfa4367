"""``gateway demo``: a newcomer opens the printed link, logs in, saves a key, sees the webhook."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from gateway.serving.tls import dev_certificate_paths
from tests.integration.conftest import GATEWAY, free_port
from tests.oidc.fixtures import OidcProvider

pytestmark = pytest.mark.slow

_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture
def start_demo(cli_environ: dict[str, str],
               tmp_path: Path) -> Iterator[Callable[..., tuple[Path, int]]]:
    """Start ``gateway demo`` (with these settings added); its log and port."""
    started: list[subprocess.Popen[bytes]] = []

    def start(**settings: str) -> tuple[Path, int]:
        port = free_port()
        log = tmp_path / "demo.log"
        environ = {k: v for k, v in cli_environ.items() if k != "GATEWAY_PUBLIC_URL"}
        with log.open("w") as handle:
            started.append(subprocess.Popen(
                [*GATEWAY, "demo", "--port", str(port)], env={**environ, **settings},
                cwd=tmp_path, stdout=handle, stderr=subprocess.STDOUT))
        return log, port

    yield start
    for process in started:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def demo(start_demo: Callable[..., tuple[Path, int]]) -> tuple[Path, int]:
    return start_demo()


def wait_for(log: Path, pattern: str, timeout: float = 60) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text())
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} never appeared:\n{log.read_text()}")


def test_the_demo_flow_works_as_a_newcomer_would_use_it(
    demo: tuple[Path, int], instance_path: Path,
) -> None:
    log, port = demo
    link = wait_for(log, r"open:\s+(\S+)\n")[1]
    user = wait_for(log, r"user:\s+(\S+)\n")[1]
    password = wait_for(log, r"password:\s+(\S+)\n")[1]
    assert link.startswith(f"https://localhost:{port}/e/el_")
    wait_for(log, r"Booting worker")

    browser = requests.Session()
    browser.trust_env = False
    browser.verify = str(dev_certificate_paths(instance_path)[0])
    login = browser.get(link, timeout=10)
    assert login.url.startswith(f"https://localhost:{port}/login")
    page = browser.post(f"https://localhost:{port}/login", timeout=10, data={
        "csrf_token": _CSRF.findall(login.text)[0], "username": user, "password": password,
        "next": f"/e/{link.rsplit('/', 1)[1]}"})
    assert page.url == link
    done = browser.post(link, timeout=10, data={
        "csrf_token": _CSRF.findall(page.text)[0], "action": "submit",
        "secret": "demo-weather-key-0042"})
    assert "This request is complete" in done.text

    event = wait_for(log, r"webhook verified: elicitation\.completed (.*)\n", timeout=30)
    assert '"hint": "…0042"' in event[1]
    assert "demo-weather-key-0042" not in log.read_text()


def test_with_the_openid_connect_login_users_sign_in_at_the_provider(
    start_demo: Callable[..., tuple[Path, int]], instance_path: Path,
    oidc_provider: OidcProvider,
) -> None:
    provider_host = oidc_provider.issuer.removeprefix("http://")
    log, port = start_demo(
        GATEWAY_LOGIN_BACKEND="oidc", GATEWAY_OIDC_ISSUER=oidc_provider.issuer,
        GATEWAY_OIDC_CLIENT_ID=oidc_provider.client_id,
        GATEWAY_OIDC_CLIENT_SECRET=oidc_provider.client_secret,
        # The demo adds its webhook receiver to these; it must not drop them.
        GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS=provider_host)
    wait_for(log, rf"Users log in at {re.escape(oidc_provider.issuer)}\.\n")
    wait_for(log, r"Booting worker")
    # No local user, no password and no link for somebody the provider does not know.
    assert "password:" not in log.read_text()
    assert "open:" not in log.read_text()

    browser = requests.Session()
    browser.trust_env = False
    browser.verify = str(dev_certificate_paths(instance_path)[0])
    login = browser.get(f"https://localhost:{port}/login", timeout=10, allow_redirects=False)
    assert login.status_code in (302, 303), login.text[:500]
    assert login.headers["Location"].startswith(f"{oidc_provider.issuer}/")
