"""``/metrics``: real counts from the database, for allowed networks or the token only."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from gateway import db
from gateway.app import create_app
from gateway.clock import FixedClock
from gateway.settings import Settings
from tests.conftest import Api, Registered, client_for
from tests.integration.api.test_create import body

TOKEN = "metrics-token-" + "m" * 30


@pytest.fixture
def base_environ(base_environ: dict[str, str]) -> dict[str, str]:
    return {**base_environ, "GATEWAY_METRICS_TOKEN": TOKEN}


def samples(client: FlaskClient, **kwargs: object) -> dict[str, float]:
    response = client.get("/metrics", **kwargs)  # type: ignore[arg-type]
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.headers["Cache-Control"] == "no-store"
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(response.get_data(as_text=True)):
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
