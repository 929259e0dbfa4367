"""A webhook receiver on loopback, and a dispatcher pointed at it."""

from __future__ import annotations

import enum
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import select

from gateway import db
from gateway.clock import Clock
from gateway.outbound import OutboundPolicy
from gateway.vault import versions
from gateway.webhooks import service
from gateway.webhooks.dispatcher import Dispatcher
from gateway.webhooks.models import WebhookAttempt, WebhookEvent
from tests.conftest import Api, Registered, client_for
from tests.integration.api.test_create import body


@dataclass
class Delivery:
    """One request the receiver got, recorded as soon as its body was read."""

    headers: dict[str, str]
    body: bytes
    # time.monotonic() at arrival, to measure how long a commit took to arrive.
    arrived_at: float = 0.0
    # The sender's TCP port, to tell which process sent it.
    sender_port: int = 0


@dataclass(frozen=True)
class Answer:
    """A status code with headers, e.g. a 503 with Retry-After."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)


class Fault(enum.Enum):
    """A receiver misbehaving below HTTP."""

    # Read the request and answer nothing until the receiver is released.
    HANG = "hang"
    # Read the request, then drop the connection with a TCP reset, no answer.
    RESET = "reset"
    # Answer one byte at a time, each well inside a socket timeout, for a minute.
    TRICKLE = "trickle"


Step = int | Answer | Fault


@dataclass
class Receiver:
    """An MCP server's webhook endpoint, with a script of answers."""

    url: str
    host: str
    deliveries: list[Delivery] = field(default_factory=list)
    # What to do with each request, in order (a status code, an Answer or a
    # Fault); then 204 for ever.
    script: list[Step] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)
    # Set to let every hanging request go (the fixture sets it at the end).
    release: threading.Event = field(default_factory=threading.Event)

    def wait_for(self, count: int, timeout: float = 10) -> list[Delivery]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.deliveries) >= count, timeout)
        return self.deliveries

    def ids(self) -> list[str]:
        """The webhook-id of every delivery, in order of arrival."""
        return [d.headers["webhook-id"] for d in self.deliveries]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as started:
        yield started


@contextmanager
def running_receiver() -> Iterator[Receiver]:
    """A receiver on a free loopback port until the block ends; hanging requests are let go."""
    state: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        # Keep-alive, as a real endpoint would: a request need not open a connection.
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            target = state["receiver"]
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with target.arrived:
                step = target.script.pop(0) if target.script else 204
                target.deliveries.append(Delivery(dict(self.headers), body, time.monotonic(),
                                                  self.client_address[1]))
                target.arrived.notify_all()
            if step is Fault.HANG:
                target.release.wait(timeout=60)
                self.close_connection = True
                return
            if step is Fault.TRICKLE:
                self.close_connection = True
                answer = b"HTTP/1.1 204 No Content\r\n" + b"X-Slow: " + b"z" * 600 + b"\r\n\r\n"
                for byte in answer:
                    if target.release.wait(timeout=0.1):
                        return
                    try:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                    except OSError:
                        return  # the sender cut the attempt off
                return
            if step is Fault.RESET:
                # SO_LINGER with a zero timeout: close() sends RST, not FIN.
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                           struct.pack("ii", 1, 0))
                self.connection.close()
                self.close_connection = True
                return
            answer = step if isinstance(step, Answer) else Answer(step)
            try:
                self.send_response(answer.status)
                if answer.status in (301, 302, 303, 307, 308):
                    self.send_header("Location", "http://127.0.0.1:1/elsewhere")
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()
            except OSError:
                self.close_connection = True  # the sender gave up already

        def log_message(self, *args: Any) -> None:
            pass

        def handle_one_request(self) -> None:
            try:
                super().handle_one_request()
            except OSError:
                self.close_connection = True  # reset or closed under us: nothing to tell

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    host = f"127.0.0.1:{server.server_address[1]}"
    state["receiver"] = Receiver(url=f"http://{host}/hooks", host=host)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state["receiver"]
    finally:
        state["receiver"].release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def base_environ(base_environ: dict[str, str], receiver: Receiver) -> dict[str, str]:
    """The receiver is on loopback over http: allowed for exactly its host and port."""
    return {**base_environ, "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": receiver.host}


@pytest.fixture
def make_dispatcher(app: Flask) -> Callable[..., Dispatcher]:
    """Dispatchers on the app's database, keyed as a worker is, sending through the guard."""

    def make(clock: Clock | None = None, concurrency: int = 4,
             policy: OutboundPolicy | None = None, **options: Any) -> Dispatcher:
        settings = app.extensions["gateway.settings"]
        clock = clock or app.extensions["gateway.clock"]
        keys = versions.for_command(settings, db.engine_of(app), clock, role="worker")
        return Dispatcher(db.engine_of(app), clock, keys,
                          policy or OutboundPolicy.from_settings(settings),
                          concurrency=concurrency, **options)

    return make


@pytest.fixture
def hooked(register: Callable[..., Registered], receiver: Receiver) -> Registered:
    """A client whose webhooks go to the receiver."""
    return register(webhook_url=receiver.url)


@pytest.fixture
def hooked_api(app: Flask, hooked: Registered) -> Api:
    return Api(client_for(app), hooked.api_token)


def end_one(api: Api, **changes: Any) -> str:
    """Create an elicitation and cancel it, which queues one event; its elicitation id."""
    created = api.post("/api/v1/elicitations", body(reuse_pending=False, **changes))
    assert created.status_code == 201, created.get_data(as_text=True)
    elicitation_id: str = created.get_json()["id"]
    cancelled = api.post(f"/api/v1/elicitations/{elicitation_id}/cancel")
    assert cancelled.status_code == 200, cancelled.get_data(as_text=True)
    return elicitation_id


def events(app: Flask) -> list[WebhookEvent]:
    """Every event in the outbox, oldest first."""
    with app.app_context():
        return list(db.session().scalars(select(WebhookEvent).order_by(
            WebhookEvent.created_at, WebhookEvent.id)))


def attempts(app: Flask, event_id: str) -> list[WebhookAttempt]:
    """The attempt log of one event, as `gateway webhooks show` lists it."""
    with app.app_context():
        return service.attempts_of(db.session(), event_id)
