"""``/metrics``: real counts from the database, for allowed networks or the token only."""

from __future__ import annotations

import http.client
import json
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from gateway import db
from gateway.app import create_app
from gateway.clock import FixedClock, SystemClock
from gateway.identity import service as identity
from gateway.metrics.counters import FOLDER_PREFIX
from gateway.outbound import OutboundPolicy
from gateway.serving.tls import dev_certificate_paths
from gateway.settings import Settings
from gateway.vault.keyring import load_keyring
from gateway.webhooks.dispatcher import Dispatcher
from tests.conftest import Api, Registered, client_for
from tests.integration.api.test_create import body
from tests.integration.conftest import Result, Server, tls_context
from tests.integration.log_canary import records
from tests.integration.portal.conftest import PASSWORD, Browser
from tests.integration.webhooks.conftest import Receiver, running_receiver

TOKEN = "metrics-token-" + "m" * 30


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """An MCP server's webhook endpoint on loopback."""
    with running_receiver() as started:
        yield started


@pytest.fixture
def base_environ(base_environ: dict[str, str], receiver: Receiver) -> dict[str, str]:
    return {**base_environ, "GATEWAY_METRICS_TOKEN": TOKEN,
            "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": receiver.host}


def samples(client: FlaskClient, **kwargs: object) -> dict[str, float]:
    response = client.get("/metrics", **kwargs)  # type: ignore[arg-type]
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.headers["Cache-Control"] == "no-store"
    return parse(response.get_data(as_text=True))


def parse(text: str) -> dict[str, float]:
    """Prometheus text as ``{"name{label=value,…}": value}``."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}"] = sample.value
    return found


def test_metrics_count_what_happened(api: Api, client: FlaskClient, app: Flask) -> None:
    first = api.post("/api/v1/elicitations", body()).get_json()
    api.post("/api/v1/elicitations", body(reuse_pending=False))
    api.post(f"/api/v1/elicitations/{first['id']}/cancel")
    found = samples(client)  # the test client comes from 127.0.0.1
    assert found["gateway_elicitations{kind=api_key,status=pending}"] == 1
    assert found["gateway_elicitations{kind=api_key,status=cancelled}"] == 1
    assert found["gateway_outbox_backlog{}"] == 0
    assert found["gateway_login_failures_total{}"] == 0
    assert found["gateway_webhook_delivery_seconds_count{}"] == 0


def test_the_outbox_backlog_is_reported(
    app: Flask, client: FlaskClient, register: Callable[..., Registered], clock: FixedClock,
) -> None:
    hooked = Api(client_for(app), register(webhook_url="https://mcp.example.com/hooks").api_token)
    created = hooked.post("/api/v1/elicitations", body()).get_json()
    hooked.post(f"/api/v1/elicitations/{created['id']}/cancel")
    clock.advance(seconds=30)
    found = samples(client)
    assert found["gateway_outbox_backlog{}"] == 1
    assert found["gateway_outbox_oldest_due_seconds{}"] == pytest.approx(30, abs=1)
    assert found["gateway_webhooks_dead{}"] == 0


def test_failed_logins_and_deliveries_are_counted(app: Flask, client: FlaskClient) -> None:
    from tests.integration.portal.conftest import Browser

    Browser(client_for(app)).log_in("nobody", password="wrong-password-here")
    assert samples(client)["gateway_login_failures_total{}"] == 1


def test_other_networks_need_the_token(app: Flask) -> None:
    outside = client_for(app)
    outside.environ_base["REMOTE_ADDR"] = "203.0.113.9"
    assert outside.get("/metrics").status_code == 404
    assert outside.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 404
    assert samples(outside, headers={"Authorization": f"Bearer {TOKEN}"})


@pytest.fixture
def wide_open(make_settings: Callable[..., Settings]) -> Iterator[Flask]:
    app = create_app(make_settings(GATEWAY_METRICS_NETWORKS="10.0.0.0/8, 203.0.113.0/24"))
    yield app
    db.engine_of(app).dispose()


def test_listed_networks_need_no_token(wide_open: Flask) -> None:
    inside = client_for(wide_open)
    inside.environ_base["REMOTE_ADDR"] = "203.0.113.9"
    assert samples(inside)
    loopback = client_for(wide_open)  # no longer listed
    assert loopback.get("/metrics").status_code == 404


def test_a_bad_network_stops_start_up(make_settings: Callable[..., Settings]) -> None:
    from gateway.settings import SettingsError

    with pytest.raises(SettingsError, match="GATEWAY_METRICS_NETWORKS"):
        make_settings(GATEWAY_METRICS_NETWORKS="not-a-network")


def test_every_figure_counts_a_real_flow(
    app: Flask, client: FlaskClient, register: Callable[..., Registered], clock: FixedClock,
    receiver: Receiver, settings: Settings,
) -> None:
    with app.app_context(), db.transaction() as session:
        identity.create_user(session, SystemClock(), username="alice", password=PASSWORD,
                             actor="test")
    hooked = Api(client_for(app), register(webhook_url=receiver.url).api_token)
    link = hooked.post("/api/v1/elicitations", body(
        subject={"iss": settings.public_url, "sub": "alice"})).get_json()
    alice = Browser(client_for(app))
    alice.log_in("alice")
    clock.advance(seconds=42)
    alice.post_form(f"/e/{link['id']}", {"action": "submit", "secret": "sk-metrics-1234"})
    Browser(client_for(app)).log_in("alice", password="not-her-password")

    # The receiver fails the first attempt; the retry, 10 s later, gets through.
    receiver.script = [500]
    dispatcher = Dispatcher(db.engine_of(app), clock, load_keyring(settings),
                            OutboundPolicy.from_settings(settings))
    assert dispatcher.run_once() == 1
    clock.advance(seconds=10)
    assert dispatcher.run_once() == 1
    assert len(receiver.deliveries) == 2

    found = samples(client)
    assert found["gateway_elicitations{kind=api_key,status=completed}"] == 1
    assert found["gateway_elicitation_completion_seconds_count{}"] == 1
    assert found["gateway_elicitation_completion_seconds_sum{}"] == 42
    assert found["gateway_elicitation_completion_seconds_bucket{le=30}"] == 0
    assert found["gateway_elicitation_completion_seconds_bucket{le=60}"] == 1
    assert found["gateway_webhook_attempts_total{outcome=failed}"] == 1
    assert found["gateway_webhook_attempts_total{outcome=delivered}"] == 1
    assert found["gateway_webhook_delivery_seconds_count{}"] == 2
    assert found["gateway_webhook_delivered_after_seconds_count{}"] == 1
    assert found["gateway_webhook_delivered_after_seconds_sum{}"] == 10
    assert found["gateway_webhook_delivered_after_seconds_bucket{le=5}"] == 0
    assert found["gateway_webhook_delivered_after_seconds_bucket{le=30}"] == 1
    assert found["gateway_outbox_backlog{}"] == 0
    assert found["gateway_login_failures_total{}"] == 1


@pytest.fixture
def tight_limits(make_settings: Callable[..., Settings]) -> Iterator[Flask]:
    app = create_app(make_settings(GATEWAY_RATELIMIT_API="2/minute",
                                   GATEWAY_RATELIMIT_LOGIN="2 per 15 minutes"))
    yield app
    db.engine_of(app).dispose()


def test_rate_limit_hits_are_counted_by_the_limit_that_refused(
    tight_limits: Flask, register: Callable[..., Registered],
) -> None:
    scraper = client_for(tight_limits)
    assert not any(name.startswith("gateway_rate_limit_hits") for name in samples(scraper))
    api = Api(client_for(tight_limits), register().api_token)
    answers = [api.get("/api/v1/elicitations").status_code for _ in range(5)]
    assert answers == [200, 200, 429, 429, 429]
    guesser = Browser(client_for(tight_limits))
    logins = [guesser.log_in("alice", password="guess-number-x").status_code for _ in range(3)]
    assert logins == [401, 401, 429]

    found = samples(scraper)
    assert found["gateway_rate_limit_hits_total{limit=api-token}"] == 3
    assert found["gateway_rate_limit_hits_total{limit=login-account}"] == 1
    assert "gateway_rate_limit_hits_total{limit=api-ip}" not in found


def get(server: Server, context: ssl.SSLContext, path: str,
        headers: dict[str, str] | None = None) -> tuple[int, str]:
    """One request on a connection of its own, so any worker process may take it."""
    connection = http.client.HTTPSConnection("localhost", server.port, timeout=10,
                                             context=context)
    connection.request("GET", path, headers={"Host": "localhost", **(headers or {})})
    response = connection.getresponse()
    answer = response.status, response.read().decode()
    connection.close()
    return answer


def processes_refusing(server: Server) -> set[int]:
    """The worker processes whose access lines show a 429."""
    return {line["pid"] for line in records(server.output(), "json")
            if line["logger"] == "gunicorn.access" and line["status"] == 429}


@pytest.mark.slow
def test_rate_limit_hits_add_up_across_worker_processes(
    start_server: Callable[..., Server], invoke_gateway: Callable[..., Result],
    cli_environ: dict[str, str], instance_path: Path,
) -> None:
    pytest.importorskip("redis")
    # Redis, so the limit holds across the processes and each refuses its share.
    environ = {**cli_environ, "GATEWAY_RATELIMIT_API": "2/minute",
               "GATEWAY_RATELIMIT_STORAGE_URL": "redis://127.0.0.1:6379/0",
               "GATEWAY_LOG_FORMAT": "json"}
    token = json.loads(invoke_gateway("clients", "create", "Busy MCP", "--json",
                                      env=environ).stdout)["api_token"]
    server = start_server("--workers", "2", env=environ)
    context = tls_context(dev_certificate_paths(instance_path)[0])
    refused = 0
    for _ in range(100):
        status, _ = get(server, context, "/api/v1/elicitations",
                        {"Authorization": f"Bearer {token}"})
        refused += status == 429
        if refused >= 6 and len(processes_refusing(server)) == 2:
            break
    assert len(processes_refusing(server)) == 2, "one process took every request"

    # Whichever process answers the scrape reports every process's refusals.
    for _ in range(6):
        status, text = get(server, context, "/metrics")
        assert status == 200
        assert parse(text)["gateway_rate_limit_hits_total{limit=api-token}"] == refused


@pytest.mark.slow
def test_a_server_keeps_its_counters_folder_only_while_it_runs(
    start_server: Callable[..., Server],
) -> None:
    finished = subprocess.Popen([sys.executable, "-c", "pass"])  # a process that has ended
    finished.wait()
    abandoned = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{finished.pid}-"))
    (abandoned / "counter_1.db").write_bytes(b"")

    server = start_server()
    assert not abandoned.exists(), "a killed server's folder is removed by the next one"
    [own] = Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}{server.process.pid}-*")
    server.process.terminate()
    server.process.wait(timeout=30)
    assert not own.exists()
