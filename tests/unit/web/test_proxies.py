"""Forwarded headers: trusted from exactly the configured hops, and a short header said once."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from flask import Flask, request
from flask.testing import FlaskClient

from gateway.app import create_app
from gateway.settings import Settings
from gateway.web import proxies
from tests.conftest import client_for

# The address the requests come from: the proxy's, as the socket shows it.
PROXY = "10.0.0.2"
CLIENT = "203.0.113.66"
FORGED = "198.51.100.7"


@pytest.fixture
def make_app(make_settings: Callable[..., Settings]) -> Callable[[int], Flask]:
    """An app trusting ``hops`` proxies, with a route answering the client address it took."""

    def make(hops: int) -> Flask:
        app = create_app(make_settings(GATEWAY_PROXY_HOPS=str(hops)))
        app.add_url_rule("/probe/address", "address", lambda: request.remote_addr or "")
        return app

    return make


def address_seen(client: FlaskClient, headers: dict[str, str]) -> str:
    response = client.get("/probe/address", headers={"X-Forwarded-Proto": "https", **headers},
                          environ_base={"REMOTE_ADDR": PROXY})
    assert response.status_code == 200
    return response.get_data(as_text=True)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.name == proxies.__name__ and record.levelno == logging.WARNING]


def test_without_hops_no_forwarded_header_is_trusted(
    make_app: Callable[[int], Flask], caplog: pytest.LogCaptureFixture,
) -> None:
    client = client_for(make_app(0))
    assert address_seen(client, {"X-Forwarded-For": CLIENT}) == PROXY
    assert warnings_of(caplog) == []  # nothing was asked of the headers


def test_a_request_without_x_forwarded_for_keeps_the_socket_address_and_says_so_once(
    make_app: Callable[[int], Flask], caplog: pytest.LogCaptureFixture,
) -> None:
    client = client_for(make_app(1))
    with caplog.at_level(logging.WARNING):
        assert address_seen(client, {}) == PROXY
        assert address_seen(client, {}) == PROXY
        assert address_seen(client, {"X-Forwarded-For": ""}) == PROXY
    assert warnings_of(caplog) == [
        f"GATEWAY_PROXY_HOPS=1 but the request carried no X-Forwarded-For: using the socket "
        f"address {PROXY} instead (said once per process; is the proxy in front setting it?)"]


def test_more_entries_than_hops_trust_only_the_configured_hop(
    make_app: Callable[[int], Flask], caplog: pytest.LogCaptureFixture,
) -> None:
    # The client wrote FORGED itself; the one proxy appended the address it saw.
    client = client_for(make_app(1))
    with caplog.at_level(logging.WARNING):
        assert address_seen(client, {"X-Forwarded-For": f"{FORGED}, {CLIENT}"}) == CLIENT
        assert address_seen(client, {"X-Forwarded-For": f"{FORGED},{FORGED}, {CLIENT}"}) == CLIENT
    assert warnings_of(caplog) == []


def test_two_hops_take_the_entry_the_outer_proxy_added(
    make_app: Callable[[int], Flask],
) -> None:
    client = client_for(make_app(2))
    assert address_seen(client, {"X-Forwarded-For": f"{FORGED}, {CLIENT}, 10.0.0.9"}) == CLIENT


def test_fewer_entries_than_hops_keep_the_socket_address(
    make_app: Callable[[int], Flask], caplog: pytest.LogCaptureFixture,
) -> None:
    # Two hops configured, one proxy in front: its entry could be the client's own forgery.
    client = client_for(make_app(2))
    with caplog.at_level(logging.WARNING):
        assert address_seen(client, {"X-Forwarded-For": CLIENT,
                                     "X-Forwarded-Proto": "https, https"}) == PROXY
    assert warnings_of(caplog) == [
        f"GATEWAY_PROXY_HOPS=2 but the request carried 1 X-Forwarded-For entry: using the "
        f"socket address {PROXY} instead (said once per process; is the proxy in front "
        "setting it?)"]


def test_a_missing_x_forwarded_proto_is_said_once_too(
    make_app: Callable[[int], Flask], caplog: pytest.LogCaptureFixture,
) -> None:
    # Behind a proxy that forgets it, a plain-http hop looks like plain http:
    # pages redirect to https, over and over.
    client = client_for(make_app(1), "http://gateway.test")
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            response = client.get("/", headers={"X-Forwarded-For": CLIENT})
            assert response.status_code == 301
    assert warnings_of(caplog) == [
        "GATEWAY_PROXY_HOPS=1 but the request carried no X-Forwarded-Proto: using the "
        "connection's scheme http instead (said once per process; is the proxy in front "
        "setting it?)"]


def test_each_short_header_is_said_once_whatever_follows(
    make_app: Callable[[int], Flask], caplog: pytest.LogCaptureFixture,
) -> None:
    client = client_for(make_app(1), "http://gateway.test")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            client.get("/", environ_base={"REMOTE_ADDR": PROXY})
    assert [message.split(":", 1)[0] for message in warnings_of(caplog)] == [
        "GATEWAY_PROXY_HOPS=1 but the request carried no X-Forwarded-For",
        "GATEWAY_PROXY_HOPS=1 but the request carried no X-Forwarded-Proto"]


def test_health_probes_without_the_headers_are_not_reported(
    make_app: Callable[[int], Flask], caplog: pytest.LogCaptureFixture,
) -> None:
    # Load balancers probe each instance directly; the first real request still counts.
    client = client_for(make_app(1))
    with caplog.at_level(logging.WARNING):
        assert client.get("/healthz", environ_base={"REMOTE_ADDR": PROXY}).status_code == 200
        assert warnings_of(caplog) == []
        address_seen(client, {})
    assert len(warnings_of(caplog)) == 1


@pytest.mark.parametrize(("hops", "said"), [
    (0, "GATEWAY_PROXY_HOPS=0: X-Forwarded-* headers are ignored; each request's address "
        "and scheme are its connection's own"),
    (1, "GATEWAY_PROXY_HOPS=1: trusting the last entry of X-Forwarded-For, -Proto, -Host "
        "and -Port, which the proxies in front add; a client's own entries before them are "
        "ignored"),
    (2, "GATEWAY_PROXY_HOPS=2: trusting the last 2 entries of X-Forwarded-For, -Proto, -Host "
        "and -Port, which the proxies in front add; a client's own entries before them are "
        "ignored"),
])
def test_what_is_trusted_is_described(
    make_settings: Callable[..., Settings], hops: int, said: str,
) -> None:
    assert proxies.describe(make_settings(GATEWAY_PROXY_HOPS=str(hops))) == said
