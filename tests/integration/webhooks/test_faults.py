"""Webhooks against a receiver that fails, and a guard that refuses where it points."""

from __future__ import annotations

import email.utils
import ipaddress
import socket
from collections.abc import Callable
from datetime import timedelta

import pytest
from flask import Flask
from sqlalchemy import select

from gateway import db
from gateway.clients import service as clients
from gateway.clients.models import Client
from gateway.clock import FixedClock, SystemClock
from gateway.credentials.catalog import current_catalog
from gateway.outbound import AttemptDeadlines, IPAddress, OutboundPolicy
from gateway.settings import Settings
from gateway.webhooks.dispatcher import MAX_RETRY_AFTER, SCHEDULE, Dispatcher
from tests.conftest import Api, client_for, command_keyring
from tests.integration.webhooks.conftest import (
    Answer,
    Fault,
    Receiver,
    Step,
    attempts,
    end_one,
    events,
)

# Long enough for a loopback answer on a busy machine, short enough to wait for.
SEND_TIMEOUT = 0.5

FAULTS: dict[str, tuple[Step, str]] = {
    "500": (500, "answered 500"),
    "timeout": (Fault.HANG, "timed out"),
    "reset": (Fault.RESET, "connection failed"),
    "302": (302, "answered 302"),
    "trickle": (Fault.TRICKLE, "timed out"),
}


def next_due(clock: FixedClock, attempt: int) -> None:
    """Move past the longest wait (jitter included) before attempt number ``attempt``."""
    clock.advance(seconds=SCHEDULE[attempt - 1].total_seconds() * 1.21)


@pytest.mark.parametrize("fault", list(FAULTS))
def test_after_a_fault_the_event_arrives_with_the_same_id(
    fault: str, app: Flask, hooked_api: Api, receiver: Receiver, clock: FixedClock,
    make_dispatcher: Callable[..., Dispatcher],
) -> None:
    step, error = FAULTS[fault]
    receiver.script = [step]
    end_one(hooked_api)
    dispatcher = make_dispatcher(send_timeout=SEND_TIMEOUT)

    assert dispatcher.run_once() == 1
    [event] = events(app)
    assert (event.status, event.attempts, event.last_error) == ("pending", 1, error)
    assert len(receiver.deliveries) == 1  # the client itself never retries

    next_due(clock, 2)
    assert dispatcher.run_once() == 1
    [event] = events(app)
    assert (event.status, event.attempts, event.last_error) == ("delivered", 2, None)
    assert receiver.ids() == [event.id, event.id]
    assert receiver.deliveries[0].body == receiver.deliveries[1].body
    log = attempts(app, event.id)
    assert [(a.number, a.outcome, a.error) for a in log] == [
        (1, "failed", error), (2, "delivered", None)]
    assert log[1].status_code == 204
    if step is Fault.HANG:
        assert log[0].latency_ms >= SEND_TIMEOUT * 1000 * 0.9
    if step is Fault.TRICKLE:
        # Each byte came well inside the socket timeout; the attempt's own
        # deadline cut it off (its watcher looks every quarter second).
        assert log[0].latency_ms <= (SEND_TIMEOUT + 2 * AttemptDeadlines.TICK_SECONDS) * 1000 + 500


def test_every_fault_in_a_row_then_recovery_is_one_delivery_per_attempt(
    app: Flask, hooked_api: Api, receiver: Receiver, clock: FixedClock,
    make_dispatcher: Callable[..., Dispatcher],
) -> None:
    receiver.script = [step for step, _ in FAULTS.values()]
    end_one(hooked_api)
    dispatcher = make_dispatcher(send_timeout=SEND_TIMEOUT)
    assert dispatcher.run_once() == 1
    for attempt in range(2, len(FAULTS) + 2):
        next_due(clock, attempt)
        assert dispatcher.run_once() == 1, f"attempt {attempt} was not due"
    [event] = events(app)
    assert (event.status, event.attempts) == ("delivered", len(FAULTS) + 1)
    assert receiver.ids() == [event.id] * (len(FAULTS) + 1)
    assert len({d.headers["webhook-timestamp"] for d in receiver.deliveries}) == len(FAULTS) + 1
    assert [(a.number, a.status_code, a.error) for a in attempts(app, event.id)] == [
        (1, 500, "answered 500"), (2, None, "timed out"), (3, None, "connection failed"),
        (4, 302, "answered 302"), (5, None, "timed out"), (6, 204, None)]


# --- Retry-After ------------------------------------------------------------------------


def test_retry_after_in_seconds_holds_the_next_attempt_back(
    app: Flask, hooked_api: Api, receiver: Receiver, clock: FixedClock,
    make_dispatcher: Callable[..., Dispatcher],
) -> None:
    receiver.script = [Answer(503, {"Retry-After": "120"})]
    end_one(hooked_api)
    dispatcher = make_dispatcher()
    failed_at = clock.now()
    assert dispatcher.run_once() == 1
    [event] = events(app)
    assert event.status == "pending"
    # The schedule alone would retry after 5 s ± 20 %.
    assert event.next_attempt_at - failed_at == timedelta(seconds=120)
    clock.advance(seconds=119)
    assert dispatcher.run_once() == 0
    clock.advance(seconds=1)
    assert dispatcher.run_once() == 1
    assert events(app)[0].status == "delivered"
    assert receiver.ids() == [event.id, event.id]


@pytest.mark.parametrize(("header", "expected"), [
    ("86400", MAX_RETRY_AFTER),            # a day: clamped to 10 h
    ("999999999999", MAX_RETRY_AFTER),     # absurd: clamped too
    ("date:300", timedelta(seconds=300)),  # an HTTP date five minutes on
])
def test_retry_after_is_read_as_seconds_or_a_date_and_clamped_at_ten_hours(
    header: str, expected: timedelta, app: Flask, hooked_api: Api, receiver: Receiver,
    clock: FixedClock, make_dispatcher: Callable[..., Dispatcher],
) -> None:
    if header.startswith("date:"):
        moment = clock.now().replace(microsecond=0) + timedelta(seconds=int(header[5:]) + 1)
        header = email.utils.format_datetime(moment, usegmt=True)
    receiver.script = [Answer(503, {"Retry-After": header})]
    end_one(hooked_api)
    failed_at = clock.now()
    make_dispatcher().run_once()
    [event] = events(app)
    assert event.status == "pending"
    assert expected <= event.next_attempt_at - failed_at <= expected + timedelta(seconds=1)


def test_a_short_retry_after_never_shortens_the_schedule(
    app: Flask, hooked_api: Api, receiver: Receiver, clock: FixedClock,
    make_dispatcher: Callable[..., Dispatcher],
) -> None:
    receiver.script = [Answer(503, {"Retry-After": "0"})]
    end_one(hooked_api)
    failed_at = clock.now()
    make_dispatcher().run_once()
    [event] = events(app)
    assert event.next_attempt_at - failed_at >= SCHEDULE[1] * 0.8


def retry_after_header(value: str, clock: FixedClock) -> str:
    """The header's text; ``date:N`` is an HTTP date N seconds after the clock's now."""
    if not value.startswith("date:"):
        return value
    moment = clock.now().replace(microsecond=0) + timedelta(seconds=int(value[5:]) + 1)
    return email.utils.format_datetime(moment, usegmt=True)


@pytest.mark.parametrize(("header", "wait"), [
    ("99999999999999999999", MAX_RETRY_AFTER),    # overflows a timedelta: capped first
    ("date:99999999999", MAX_RETRY_AFTER),        # a date thousands of years on
    ("date:600", timedelta(seconds=600)),
    ("date:-600", None),                          # a date gone by: the schedule's wait
    ("soon", None),
    ("-5", None),
    ("1e9", None),
    ("\u00b2\u00b3", None),                       # digits to str.isdigit(), not to int()
    ("Sun, 99 Foo 2026 25:61:61 GMT", None),
    ("", None),
], ids=["huge", "far-date", "date", "past-date", "word", "negative", "exponent",
        "superscript", "bad-date", "empty"])
def test_any_retry_after_leaves_one_recorded_attempt_and_a_wait_on_the_schedule(
    header: str, wait: timedelta | None, app: Flask, hooked_api: Api, receiver: Receiver,
    clock: FixedClock, make_dispatcher: Callable[..., Dispatcher],
) -> None:
    receiver.script = [Answer(503, {"Retry-After": retry_after_header(header, clock)})]
    end_one(hooked_api)
    dispatcher = make_dispatcher()
    failed_at = clock.now()

    assert dispatcher.run_once() == 1
    [event] = events(app)
    assert (event.status, event.attempts, event.last_error) == ("pending", 1, "answered 503")
    assert [(a.number, a.outcome, a.status_code, a.error) for a in attempts(app, event.id)] == [
        (1, "failed", 503, "answered 503")]
    held = event.next_attempt_at - failed_at
    if wait is None:  # the schedule's own wait before attempt 2, jitter included
        assert SCHEDULE[1] * 0.8 <= held <= SCHEDULE[1] * 1.2
    else:
        assert wait <= held <= wait + timedelta(seconds=1)
        assert held <= max(SCHEDULE) + timedelta(seconds=1)

    # Not a moment before it is due, then exactly once.
    clock.advance(seconds=held.total_seconds() - 1)
    assert dispatcher.run_once() == 0
    clock.advance(seconds=1)
    assert dispatcher.run_once() == 1
    [event] = events(app)
    assert (event.status, event.attempts) == ("delivered", 2)
    assert [(a.number, a.outcome) for a in attempts(app, event.id)] == [
        (1, "failed"), (2, "delivered")]
    assert receiver.ids() == [event.id, event.id]


def test_an_attempt_that_raises_is_recorded_as_failed_and_retried_on_schedule(
    app: Flask, hooked_api: Api, receiver: Receiver, clock: FixedClock,
    make_dispatcher: Callable[..., Dispatcher], caplog: pytest.LogCaptureFixture,
) -> None:
    end_one(hooked_api)
    # By name, so the resolver is asked; it answers nonsense, and the send
    # raises something no handler expects.
    port = int(receiver.host.rsplit(":", 1)[1])
    local = frozenset({f"localhost:{port}"})
    with app.app_context(), db.transaction() as session:
        for client in session.scalars(select(Client)):
            client.webhook_url = f"http://localhost:{port}/hooks"
    garbled = OutboundPolicy(insecure_hosts=local, resolve=lambda host, port: ["not-an-address"])
    failed_at = clock.now()
    assert make_dispatcher(policy=garbled).run_once() == 1
    [event] = events(app)
    reason = "the attempt failed unexpectedly (ValueError)"
    assert (event.status, event.attempts, event.last_error) == ("pending", 1, reason)
    assert [(a.number, a.outcome, a.error) for a in attempts(app, event.id)] == [
        (1, "failed", reason)]
    assert SCHEDULE[1] * 0.8 <= event.next_attempt_at - failed_at <= SCHEDULE[1] * 1.2
    assert "delivering " + event.id + " failed unexpectedly" in caplog.text

    next_due(clock, 2)
    assert make_dispatcher(policy=OutboundPolicy(insecure_hosts=local)).run_once() == 1
    assert events(app)[0].status == "delivered"
    assert receiver.ids() == [event.id]


# --- the SSRF guard at send time ----------------------------------------------------------


class Wire:
    """The policy's seams: a resolver that answers what a test says, a connector that records."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses
        self.connected: list[str] = []

    def resolve(self, host: str, port: int) -> list[str]:
        return self.addresses

    def connect(self, address: IPAddress, port: int, timeout: float | None) -> socket.socket:
        self.connected.append(str(address))
        raise ConnectionRefusedError("no connection leaves a test")


@pytest.mark.parametrize(("addresses", "refused"), [
    (["10.0.0.5"], "10.0.0.5"),
    (["169.254.169.254"], "169.254.169.254"),
    (["93.184.215.14", "127.0.0.1"], "127.0.0.1"),  # one bad answer spoils the lookup
    (["::ffff:192.168.1.1"], "::ffff:192.168.1.1"),
])
def test_a_name_that_resolves_to_a_private_address_at_send_time_is_refused(
    addresses: list[str], refused: str, app: Flask, settings: Settings, clock: FixedClock,
    make_dispatcher: Callable[..., Dispatcher],
) -> None:
    # The name was public when the client was registered (DNS rebinding after).
    public = OutboundPolicy(resolve=lambda host, port: ["93.184.215.14"])
    with app.app_context(), command_keyring(app) as keyring, db.transaction() as session:
        minted = clients.create_client(
            session, SystemClock(), keyring=keyring, pepper=settings.token_pepper,
            catalog=current_catalog(), name="rebinding", webhook_url="https://hooks.example.com/x",
            credential_types=[], actor="test", policy=public)
    end_one(Api(client_for(app), minted.api_token))
    wire = Wire(addresses)
    dispatcher = make_dispatcher(policy=OutboundPolicy(resolve=wire.resolve, connect=wire.connect))

    assert dispatcher.run_once() == 1
    assert wire.connected == []
    [event] = events(app)
    assert (event.status, event.attempts) == ("pending", 1)
    assert event.last_error is not None
    assert "refused" in event.last_error
    assert f"{ipaddress.ip_address(refused)} is " in event.last_error
    [attempt] = attempts(app, event.id)
    assert (attempt.outcome, attempt.status_code) == ("failed", None)


def test_a_loopback_receiver_not_listed_as_insecure_is_refused(
    app: Flask, settings: Settings, receiver: Receiver, make_dispatcher: Callable[..., Dispatcher],
) -> None:
    port = int(receiver.host.rsplit(":", 1)[1])
    url = f"https://localhost:{port}/hooks"
    allowed_then = OutboundPolicy(insecure_hosts=frozenset({f"localhost:{port}"}))
    with app.app_context(), command_keyring(app) as keyring, db.transaction() as session:
        minted = clients.create_client(
            session, SystemClock(), keyring=keyring, pepper=settings.token_pepper,
            catalog=current_catalog(), name="loopback", webhook_url=url, credential_types=[],
            actor="test", policy=allowed_then)
    end_one(Api(client_for(app), minted.api_token))
    # The real resolver, and a policy with no development hosts at all.
    assert make_dispatcher(policy=OutboundPolicy()).run_once() == 1
    [event] = events(app)
    assert event.status == "pending"
    assert event.last_error is not None
    assert "is loopback" in event.last_error
    assert receiver.deliveries == []
