"""A Stripe-compatible API on loopback, for ``gateway serve`` under the browser tests.

It answers the two calls the gateway makes as Stripe does: ``POST
/v1/checkout/sessions`` (the checkout button: one session per
Idempotency-Key, with a hosted page on checkout.stripe.com) and ``GET
/v1/checkout/sessions/{id}`` (the user's return from that page). A test
that plays the user on Stripe's page marks the session paid with ``pay``.
The gateway reaches it through ``GATEWAY_STRIPE_API_BASE``; the browser
never talks to it.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

CHECKOUT_HOST = "https://checkout.stripe.com"


@dataclass
class StripeStub:
    """What the stub was asked, and the sessions it made."""

    port: int = 0
    created: list[dict[str, str]] = field(default_factory=list)
    idempotency_keys: list[str] = field(default_factory=list)
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)
    _by_key: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def create(self, body: dict[str, str], key: str) -> dict[str, Any]:
        with self._lock:
            self.created.append(body)
            self.idempotency_keys.append(key)
            if key in self._by_key:
                return self.sessions[self._by_key[key]]
            session_id = "cs_test_" + secrets.token_hex(12)
            session = {
                "id": session_id, "object": "checkout.session",
                "url": f"{CHECKOUT_HOST}/c/pay/{session_id}", "status": "open",
                "payment_status": "unpaid", "mode": body.get("mode"),
                "amount_total": int(body.get("line_items[0][price_data][unit_amount]", "0")),
                "currency": body.get("line_items[0][price_data][currency]"),
                "client_reference_id": body.get("client_reference_id"),
                "success_url": body.get("success_url"),
                "expires_at": int(body.get("expires_at", "0")),
                "payment_intent": None, "subscription": None,
            }
            self.sessions[session_id] = session
            self._by_key[key] = session_id
            return session

    def pay(self, session_id: str) -> None:
        """What Stripe records when the user pays on its page."""
        with self._lock:
            self.sessions[session_id].update(
                status="complete", payment_status="paid",
                payment_intent="pi_test_" + secrets.token_hex(12))

    def retrieve(self, session_id: str) -> dict[str, Any] | None:
        with self._lock:
            found = self.sessions.get(session_id)
            return dict(found) if found else None


def _handler(stub: StripeStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = dict(parse_qsl(self.rfile.read(length).decode()))
            if self.path != "/v1/checkout/sessions":
                self._answer(404, {"error": {"type": "invalid_request_error",
                                             "message": "Unrecognized request URL"}})
                return
            self._answer(200, stub.create(body, self.headers.get("Idempotency-Key", "")))

        def do_GET(self) -> None:
            prefix, path = "/v1/checkout/sessions/", urlsplit(self.path).path
            found = stub.retrieve(path.removeprefix(prefix)) if path.startswith(prefix) else None
            if found is None:
                self._answer(404, {"error": {"type": "invalid_request_error",
                                             "message": "No such checkout session"}})
                return
            self._answer(200, found)

        def _answer(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return  # quiet: the test reads what was asked from the stub itself

    return Handler


@contextmanager
def running_stub() -> Iterator[StripeStub]:
    """The stub, serving on a free loopback port until the block ends."""
    stub = StripeStub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(stub))
    stub.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
