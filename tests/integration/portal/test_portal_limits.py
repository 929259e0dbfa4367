"""The portal's routes open to visitors with no session: limited per address, never audited.

Anyone can send a provider's return (``/oauth/callback``) or a login form;
what such a request costs the gateway is bounded per address, and a return
that reaches no signed-in browser is counted in ``/metrics`` and logged, not
written to the append-only audit trail one record each.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterator

import pytest
from flask import Flask, url_for
from flask.testing import FlaskClient
from sqlalchemy import func, select

from gateway import db
from gateway.app import create_app
from gateway.audit.models import AuditEvent
from gateway.settings import Settings
from tests.conftest import client_for
from tests.integration.conftest import free_port
from tests.integration.portal.conftest import Browser
from tests.integration.test_metrics import samples

UNREACHABLE_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1
LOGIN_LIMIT = 10  # GATEWAY_RATELIMIT_LOGIN's default, "10 per 15 minutes"


@pytest.fixture
def limited_app(make_settings: Callable[..., Settings]) -> Iterator[Callable[..., Flask]]:
    """Apps with their own settings, each with its own engine and limiter."""
    made: list[Flask] = []

    def make(**settings: str) -> Flask:
        app = create_app(make_settings(**settings))
        made.append(app)
        return app

    yield make
    for app in made:
        db.engine_of(app).dispose()


def from_address(app: Flask, address: str) -> FlaskClient:
    client = client_for(app)
    client.environ_base["REMOTE_ADDR"] = address
    return client


def callback(app: Flask, query: str) -> str:
    """The path of an OAuth provider's return, whatever its rule's shape, with ``query``."""
    [rule, *_] = app.url_map.iter_rules("oauth.callback")
    with app.test_request_context():
        path = url_for("oauth.callback", **dict.fromkeys(rule.arguments, "example"))
    return f"{path}?{query}"


def audit_records(app: Flask) -> int:
    with app.app_context():
        return db.session().scalar(select(func.count()).select_from(AuditEvent)) or 0


def test_anonymous_callbacks_write_no_audit_record_and_are_counted_and_logged(
    app: Flask, caplog: pytest.LogCaptureFixture,
) -> None:
    stranger = from_address(app, "198.51.100.7")
    before = audit_records(app)
    with caplog.at_level(logging.INFO, logger="gateway.oauth.views"):
        answers = [stranger.get(callback(app, f"code=c{n}&state=s{n}")).status_code
                   for n in range(200)]
    # Under the default GATEWAY_RATELIMIT_PORTAL ("300/minute"): each is answered.
    assert answers == [400] * 200
    assert audit_records(app) == before
    refused = [r for r in caplog.records if r.name == "gateway.oauth.views"]
    assert len(refused) == 200
    assert "no-session" in refused[0].getMessage()
    assert "198.51.100.7" in refused[0].getMessage()
    found = samples(client_for(app))  # the scrape comes from loopback
    assert found["gateway_oauth_callbacks_refused_total{reason=no-session}"] == 200


def test_past_the_portal_limit_an_address_gets_429_on_every_open_route(
    limited_app: Callable[..., Flask],
) -> None:
    app = limited_app(GATEWAY_RATELIMIT_PORTAL="5/minute")
    stranger, neighbour = from_address(app, "198.51.100.7"), from_address(app, "198.51.100.8")
    answers = [stranger.get(callback(app, "code=c&state=s")).status_code for _ in range(3)]
    answers += [stranger.get("/login").status_code for _ in range(2)]
    assert answers == [400, 400, 400, 200, 200]
    for path in (callback(app, "code=c&state=s"), "/login", "/login/callback"):
        refused = stranger.get(path)
        assert refused.status_code == 429, path
        assert 0 < int(refused.headers["Retry-After"]) <= 60
        assert "Too many requests from your address" in refused.get_data(as_text=True)
    # Another address has its budget; routes outside the portal's open ones are not limited.
    assert neighbour.get("/login").status_code == 200
    assert stranger.get("/healthz").status_code == 200
    found = samples(client_for(app))
    assert found["gateway_rate_limit_hits_total{limit=portal-ip}"] == 3
    assert found["gateway_oauth_callbacks_refused_total{reason=no-session}"] == 3


def test_the_login_lockout_holds_while_the_rate_limit_store_is_away(
    limited_app: Callable[..., Flask], alice: str, caplog: pytest.LogCaptureFixture,
) -> None:
    pytest.importorskip("redis")
    app = limited_app(GATEWAY_RATELIMIT_STORAGE_URL=UNREACHABLE_REDIS)
    # The app fixture's database, with alice in it, is the one this app uses too.
    user = Browser(client_for(app))
    with caplog.at_level(logging.INFO):
        # The lockout counts in the database: Redis being away lifts nothing.
        guesses = [user.log_in(alice, password="guess-guess-guess").status_code
                   for _ in range(LOGIN_LIMIT)]
        last = user.log_in(alice)
    assert guesses == [401] * LOGIN_LIMIT
    assert last.status_code == 429
    assert "Too many failed logins" in last.get_data(as_text=True)
    assert user.get("/account").status_code == 302  # to the login page: nobody signed in
    outage = [r for r in caplog.records if r.name == "gateway.web.ratelimit"]
    assert [(r.levelname, "unreachable" in r.getMessage()) for r in outage] == [
        ("ERROR", True)]
    assert not [r for r in caplog.records if r.name == "flask-limiter"]
    found = samples(client_for(app))
    # Each login is two requests (the form, then its post), all uncounted by
    # the portal's limit; the lockout's refusal is counted as such.
    assert found["gateway_rate_limit_storage_errors_total{}"] == 2 * (LOGIN_LIMIT + 1)
    assert found["gateway_rate_limit_hits_total{limit=login-account}"] == 1


class Cable:
    """A TCP relay to Redis that a test can unplug and plug back, on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []

    def plug(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def unplug(self) -> None:
        assert self._listener is not None
        # A close alone leaves a thread blocked in accept() accepting still (Linux).
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for connection in self._open:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
            connection.close()
        self._open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # unplugged
            server = socket.create_connection(self.target)
            self._open += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


@pytest.fixture
def cable() -> Iterator[Cable]:
    pytest.importorskip("redis")
    relay = Cable(("127.0.0.1", 6379))
    relay.plug()
    yield relay
    with contextlib.suppress(AssertionError, OSError):
        relay.unplug()


def test_an_outage_of_redis_is_said_once_and_its_end_once_and_logins_resume(
    limited_app: Callable[..., Flask], alice: str, cable: Cable,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = limited_app(GATEWAY_RATELIMIT_STORAGE_URL=f"redis://127.0.0.1:{cable.port}/0")
    user = Browser(client_for(app))
    with caplog.at_level(logging.INFO):
        assert user.get("/login").status_code == 200
        cable.unplug()
        assert [user.get("/login").status_code for _ in range(5)] == [200] * 5
        # Logins go on: their lockout counts in the database.
        assert user.log_in(alice).status_code == 303
        cable.plug()
        assert user.log_in(alice).status_code == 303
        assert user.get("/login").status_code == 200
    said = [(r.levelname, r.getMessage().split(" (")[0].split(":")[0])
            for r in caplog.records if r.name == "gateway.web.ratelimit"]
    assert said == [("ERROR", "rate-limit storage unreachable"),
                    ("WARNING", "rate-limit storage reachable again")]
