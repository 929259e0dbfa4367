"""Rate limits: per token and per source address, 429 with Retry-After, shared through Redis."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator

import pytest
from flask import Flask

from gateway import db
from gateway.app import create_app
from gateway.settings import Settings
from tests.conftest import Api, Registered, client_for
from tests.integration.api.test_create import assert_problem

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def limited_app(make_settings: Callable[..., Settings]) -> Iterator[Callable[..., Flask]]:
    """Apps with tight limits; each gets its own engine and limiter."""
    made: list[Flask] = []

    def make(**limits: str) -> Flask:
        app = create_app(make_settings(**limits))
        made.append(app)
        return app

    yield make
    for app in made:
        db.engine_of(app).dispose()


def test_over_the_token_limit_gets_429_with_retry_after(
    limited_app: Callable[..., Flask], register: Callable[..., Registered],
) -> None:
    app = limited_app(GATEWAY_RATELIMIT_API="3/minute")
    first, second = register(), register()
    api = Api(client_for(app), first.api_token)
    for _ in range(3):
        assert api.get("/api/v1/elicitations").status_code == 200
    refused = api.get("/api/v1/elicitations")
    assert_problem(refused, 429, "this API token")
    assert 0 < int(refused.headers["Retry-After"]) <= 60
    # Another token from the same address has its own budget.
    assert Api(client_for(app), second.api_token).get("/api/v1/elicitations").status_code == 200


def test_api_answers_report_the_token_budget(
    limited_app: Callable[..., Flask], register: Callable[..., Registered],
) -> None:
    app = limited_app(GATEWAY_RATELIMIT_API="5/minute")
    api = Api(client_for(app), register().api_token)
    first, second = api.get("/api/v1/elicitations"), api.get("/api/v1/elicitations")
    assert first.headers["X-RateLimit-Limit"] == "5"
    assert [first.headers["X-RateLimit-Remaining"],
            second.headers["X-RateLimit-Remaining"]] == ["4", "3"]
    assert 0 < int(first.headers["X-RateLimit-Reset"]) - time.time() <= 61
    # Retry-After is for refusals only: an answer that went through asks no wait.
    assert "Retry-After" not in first.headers


def test_one_budget_covers_every_route_of_the_api(
    limited_app: Callable[..., Flask], register: Callable[..., Registered],
) -> None:
    app = limited_app(GATEWAY_RATELIMIT_API="3/minute")
    api = Api(client_for(app), register().api_token)
    assert api.get("/api/v1/elicitations").status_code == 200
    assert api.get("/api/v1/credentials").status_code == 200
    assert api.get("/api/v1/elicitations").status_code == 200
    assert_problem(api.get("/api/v1/credentials"), 429)


def test_a_new_window_starts_a_new_budget(
    limited_app: Callable[..., Flask], register: Callable[..., Registered],
) -> None:
    app = limited_app(GATEWAY_RATELIMIT_API="2/second")
    api = Api(client_for(app), register().api_token)
    answers = [api.get("/api/v1/elicitations").status_code for _ in range(3)]
    assert answers == [200, 200, 429]
    time.sleep(1.1)
    assert api.get("/api/v1/elicitations").status_code == 200


def test_the_address_limit_holds_whatever_the_token(
    limited_app: Callable[..., Flask], register: Callable[..., Registered],
) -> None:
    app = limited_app(GATEWAY_RATELIMIT_API_IP="4/minute")
    client = client_for(app)
    for _ in range(4):
        client.get("/api/v1/elicitations", headers={"Authorization": "Bearer gw_guess"})
    response = Api(client, register().api_token).get("/api/v1/elicitations")
    assert_problem(response, 429, "this address")
    assert "Retry-After" in response.headers


def test_instances_share_their_counters_through_redis(
    limited_app: Callable[..., Flask], register: Callable[..., Registered],
) -> None:
    pytest.importorskip("redis")
    limits = {"GATEWAY_RATELIMIT_API": "4/minute",
              "GATEWAY_RATELIMIT_STORAGE_URL": REDIS_URL}
    one, two = limited_app(**limits), limited_app(**limits)
    token = register().api_token
    # A fresh token: its counter starts at zero in the shared store.
    first, second = Api(client_for(one), token), Api(client_for(two), token)
    for api in (first, second, first, second):
        assert api.get("/api/v1/elicitations").status_code == 200
    assert first.get("/api/v1/elicitations").status_code == 429
    assert second.get("/api/v1/elicitations").status_code == 429


def test_the_limiter_is_keyed_by_digest_never_by_token(
    limited_app: Callable[..., Flask], register: Callable[..., Registered],
) -> None:
    redis = pytest.importorskip("redis")
    app = limited_app(GATEWAY_RATELIMIT_STORAGE_URL=REDIS_URL)
    token = register().api_token
    marker = secrets.token_hex(4)
    Api(client_for(app), token).get(f"/api/v1/elicitations?subject_sub={marker}")
    store = redis.Redis.from_url(REDIS_URL)
    keys = [key.decode() for key in store.scan_iter("*gateway*")]
    assert keys, "the limiter wrote no counters"
    assert not any(token in key or token[3:] in key for key in keys)


def test_a_storage_outage_lets_the_api_answer(
    limited_app: Callable[..., Flask], register: Callable[..., Registered],
    caplog: pytest.LogCaptureFixture,
) -> None:
    pytest.importorskip("redis")
    # Nothing listens on port 1: every count fails.
    app = limited_app(GATEWAY_RATELIMIT_API="1/minute",
                      GATEWAY_RATELIMIT_STORAGE_URL="redis://127.0.0.1:1/0")
    api = Api(client_for(app), register().api_token)
    for _ in range(3):
        response = api.get("/api/v1/elicitations")
        assert response.status_code == 200
        assert "X-RateLimit-Remaining" not in response.headers
    # Said once, at error level, not a traceback per request; and counted.
    [said] = [r for r in caplog.records if "rate-limit storage unreachable" in r.getMessage()]
    assert said.levelname == "ERROR"
    assert "Failed to rate limit" not in caplog.text
    metrics = client_for(app).get("/metrics").get_data(as_text=True)  # from loopback
    assert "gateway_rate_limit_storage_errors_total 3.0" in metrics
