"""A webhook receiver on loopback, and a dispatcher pointed at it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from flask import Flask

from gateway import db
from gateway.clock import Clock
from gateway.vault.keyring import load_keyring
from gateway.webhooks.dispatcher import Dispatcher
from gateway.webhooks.http import OutboundPolicy


@dataclass
class Delivery:
    """One request the receiver got."""

    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """An MCP server's webhook endpoint, with a script of answers."""

    url: str
    host: str
    deliveries: list[Delivery] = field(default_factory=list)
    # Status codes to answer with, in order; then 204 for ever.
    script: list[int] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def wait_for(self, count: int, timeout: float = 10) -> list[Delivery]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.deliveries) >= count, timeout)
        return self.deliveries


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            target = state["receiver"]
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            status = target.script.pop(0) if target.script else 204
            self.send_response(status)
            if status in (301, 302):
                self.send_header("Location", "http://127.0.0.1:1/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()
            with target.arrived:
                target.deliveries.append(Delivery(dict(self.headers), body))
                target.arrived.notify_all()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    host = f"127.0.0.1:{server.server_address[1]}"
    state["receiver"] = Receiver(url=f"http://{host}/hooks", host=host)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state["receiver"]
    server.shutdown()
    server.server_close()


@pytest.fixture
def base_environ(base_environ: dict[str, str], receiver: Receiver) -> dict[str, str]:
    """The receiver is on loopback over http: allowed for exactly its host and port."""
    return {**base_environ, "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": receiver.host}


@pytest.fixture
def make_dispatcher(app: Flask) -> Callable[..., Dispatcher]:
    """Dispatchers on the app's database, sending through the guarded client."""

    def make(clock: Clock | None = None, concurrency: int = 4) -> Dispatcher:
        settings = app.extensions["gateway.settings"]
        return Dispatcher(db.engine_of(app), clock or app.extensions["gateway.clock"],
                          load_keyring(settings), OutboundPolicy.from_settings(settings),
                          concurrency=concurrency)

    return make
