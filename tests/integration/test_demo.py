"""``gateway demo``: a newcomer opens the printed link, logs in, saves a key, sees the webhook."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from gateway.clients.models import Client
from gateway.identity.models import User
from gateway.serving.tls import dev_certificate_paths
from tests.integration.conftest import GATEWAY, Result, free_port
from tests.oidc.fixtures import OidcProvider

pytestmark = pytest.mark.slow

_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


@dataclass
class Demo:
    """A running ``gateway demo``: its output so far and its port."""

    process: subprocess.Popen[bytes]
    log: Path
    port: int

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def start_demo(cli_environ: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Demo]]:
    """Start ``gateway demo`` (with these settings added) in the test's instance folder."""
    started: list[Demo] = []

    def start(**settings: str) -> Demo:
        port = free_port()
        log = tmp_path / f"demo-{port}.log"
        environ = {k: v for k, v in cli_environ.items() if k != "GATEWAY_PUBLIC_URL"}
        with log.open("w") as handle:
            process = subprocess.Popen(
                [*GATEWAY, "demo", "--port", str(port)], env={**environ, **settings},
                cwd=tmp_path, stdout=handle, stderr=subprocess.STDOUT)
        started.append(Demo(process, log, port))
        return started[-1]

    yield start
    for demo in started:
        demo.stop()


@pytest.fixture
def demo(start_demo: Callable[..., Demo]) -> Demo:
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
    demo: Demo, instance_path: Path,
) -> None:
    enter_a_key_at_the_link(demo, instance_path, "demo-weather-key-0042")
    event = wait_for(demo.log, r"webhook verified: elicitation\.completed (.*)\n", timeout=30)
    assert '"hint": "…0042"' in event[1]
    assert "demo-weather-key-0042" not in demo.log.read_text()


def enter_a_key_at_the_link(demo: Demo, instance_path: Path, key: str) -> None:
    """Open the printed link, log in with the printed user, enter ``key``."""
    log, port = demo.log, demo.port
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
        "csrf_token": _CSRF.findall(page.text)[0], "action": "submit", "secret": key})
    assert "This request is complete" in done.text


def test_a_second_run_keeps_the_one_demo_server_and_aims_it_at_its_own_receiver(
    start_demo: Callable[..., Demo], instance_path: Path, engine: Engine,
) -> None:
    first = start_demo()
    first_hooks = wait_for(first.log, r"go to (http://127\.0\.0\.1:\d+/hooks);")[1]
    wait_for(first.log, r"Booting worker")
    first.stop()

    second = start_demo()
    second_hooks = wait_for(second.log, r"go to (http://127\.0\.0\.1:\d+/hooks);")[1]
    assert second_hooks != first_hooks
    with Session(engine) as session:
        registered = session.execute(select(Client.name, Client.webhook_url)).all()
        users = session.scalars(select(User.username)).all()
    assert [tuple(row) for row in registered] == [("Demo MCP server", second_hooks)]
    assert users == ["demo"]
    # The reused registration's secret, read back from the vault, verifies its webhooks.
    enter_a_key_at_the_link(second, instance_path, "second-run-key-0077")
    event = wait_for(second.log, r"webhook verified: elicitation\.completed (.*)\n", timeout=30)
    assert '"hint": "…0077"' in event[1]
    assert "WARNING gateway.serving.cli" not in second.log.read_text()  # no refused webhook URL


def test_the_instance_configs_development_hosts_stay_allowed_beside_the_receiver(
    start_demo: Callable[..., Demo], run_gateway: Callable[..., Result],
    cli_environ: dict[str, str], instance_path: Path,
) -> None:
    elsewhere = f"127.0.0.1:{free_port()}"  # an MCP server of the operator's, say
    demo = start_demo()
    wait_for(demo.log, r"Booting worker")
    demo.stop()
    # The operator adds a host to the list the demo keeps in the config file.
    config = instance_path / "gateway.toml"
    config.write_text(config.read_text().replace(
        "outbound_allow_insecure_hosts = [", f'outbound_allow_insecure_hosts = ["{elsewhere}", '))
    # Every command reads the instance's config, so the CLI may register such a server...
    created = run_gateway("clients", "create", "Local MCP", "--webhook-url",
                          f"http://{elsewhere}/hooks")
    assert created.code == 0, created.stderr
    # ...and the demo adds its receiver to that list rather than replacing it.
    demo = start_demo()
    relaxed = wait_for(demo.log, r"OUTBOUND GUARD RELAXED for (.*) \(")[1].split(", ")
    receiver = wait_for(demo.log, r"go to http://(127\.0\.0\.1:\d+)/hooks;")[1]
    assert sorted(relaxed) == sorted([elsewhere, receiver])
    assert "WARNING gateway.serving.cli" not in demo.log.read_text()


def test_status_run_beside_the_demo_sees_its_settings(
    start_demo: Callable[..., Demo], run_gateway: Callable[..., Result],
    cli_environ: dict[str, str],
) -> None:
    environ = {k: v for k, v in cli_environ.items() if k != "GATEWAY_PUBLIC_URL"}
    first = start_demo()
    wait_for(first.log, r"Booting worker")
    first.stop()
    demo = start_demo()
    receiver = wait_for(demo.log, r"go to http://(127\.0\.0\.1:\d+)/hooks;")[1]
    wait_for(demo.log, r"Booting worker")

    status = run_gateway("status", "--json", env=environ)
    assert status.code == 0, status.stdout + status.stderr
    report = json.loads(status.stdout)
    assert report["configuration"] == []  # the demo's receiver may be called over http
    assert report["public_url"] == f"https://localhost:{demo.port}"
    # Only this run's receiver is allowed: the first run's left the list.
    relaxed = wait_for(demo.log, r"OUTBOUND GUARD RELAXED for (.*) \(")[1]
    assert relaxed == receiver


def test_the_demo_refuses_an_instance_set_up_for_another_origin(
    start_demo: Callable[..., Demo], run_gateway: Callable[..., Result],
    cli_environ: dict[str, str], instance_path: Path,
) -> None:
    environ = {**cli_environ, "GATEWAY_PUBLIC_URL": "https://gateway.example.com"}
    assert run_gateway("init", "--public-url", "https://gateway.example.com",
                       env=environ).code == 0
    before = (instance_path / "gateway.toml").read_text()
    demo = start_demo()
    assert demo.process.wait(timeout=60) == 1
    assert ("is set up for https://gateway.example.com; the demo serves "
            f"https://localhost:{demo.port}") in demo.log.read_text()
    assert (instance_path / "gateway.toml").read_text() == before


def test_with_the_openid_connect_login_users_sign_in_at_the_provider(
    start_demo: Callable[..., Demo], instance_path: Path, oidc_provider: OidcProvider,
) -> None:
    provider_host = oidc_provider.issuer.removeprefix("http://")
    demo = start_demo(
        GATEWAY_LOGIN_BACKEND="oidc", GATEWAY_OIDC_ISSUER=oidc_provider.issuer,
        GATEWAY_OIDC_CLIENT_ID=oidc_provider.client_id,
        GATEWAY_OIDC_CLIENT_SECRET=oidc_provider.client_secret,
        # The demo adds its webhook receiver to these; it must not drop them.
        GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS=provider_host)
    log, port = demo.log, demo.port
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
