"""Stripe, simulated at its HTTP API with ``responses``, and events signed as Stripe signs them.

The gateway runs its real Stripe client (the ``stripe`` library over the
SSRF-guarded session); only the wire is answered here. The simulation keeps
Checkout Sessions the way Stripe does: one per Idempotency-Key, readable
by id, moved on by the test (paid, processing, expired) as a user and their
bank would.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

import pytest
import responses
from flask import Flask
from flask.testing import FlaskClient
from requests import PreparedRequest
from sqlalchemy import select
from werkzeug.test import TestResponse

from gateway import db
from gateway.elicitations.models import Elicitation
from gateway.payments.models import Payment, StripeEvent
from gateway.settings import Settings
from gateway.webhooks.models import WebhookEvent
from tests.conftest import Api, Registered, client_for
from tests.integration.portal.conftest import (  # noqa: F401  (the portal's fixtures, shared)
    Browser,
    alice,
    bob,
    browser,
    link_for,
    make_user,
)

STRIPE_KEY = "sk_test_gateway_" + "k" * 24
STRIPE_WEBHOOK_SECRET = "whsec_test_" + "w" * 32
STRIPE_API = "https://api.stripe.com"
CHECKOUT_HOST = "https://checkout.stripe.com"


@dataclass
class Receiver:
    """The MCP server's webhook endpoint on loopback: it keeps what it is sent."""

    port: int
    deliveries: list[tuple[dict[str, str], bytes]] = field(default_factory=list)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}/gateway-events"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    found = Receiver(server.server_address[1])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            found.deliveries.append((dict(self.headers.items()), body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    server.RequestHandlerClass = Handler
    # A short poll interval: shutting down waits for one.
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield found
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def settings(make_settings: Callable[..., Settings], receiver: Receiver) -> Settings:
    """A gateway that takes payments, and may call the receiver on loopback."""
    return make_settings(GATEWAY_STRIPE_SECRET_KEY=STRIPE_KEY,
                         GATEWAY_STRIPE_WEBHOOK_SECRET=STRIPE_WEBHOOK_SECRET,
                         GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS=receiver.host)


# --- the simulated Stripe API ----------------------------------------------------


@dataclass
class FakeStripe:
    """Stripe's Checkout Session endpoints, answering as the real API does."""

    mock: responses.RequestsMock
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)
    by_idempotency_key: dict[str, str] = field(default_factory=dict)
    created: list[dict[str, Any]] = field(default_factory=list)  # each create's parsed body
    create_headers: list[dict[str, str]] = field(default_factory=list)
    retrieved: list[str] = field(default_factory=list)
    fail_with: int | None = None

    def install(self) -> None:
        self.mock.add_callback(responses.POST, f"{STRIPE_API}/v1/checkout/sessions",
                               callback=self._create)
        self.mock.add_callback(responses.GET, _session_url_pattern(), callback=self._retrieve)

    def _create(self, request: PreparedRequest) -> tuple[int, dict[str, str], str]:
        body = dict(parse_qsl(_text(request.body)))
        self.created.append(body)
        self.create_headers.append(dict(request.headers))
        if self.fail_with is not None:
            return self.fail_with, {}, json.dumps({"error": {
                "type": "invalid_request_error" if self.fail_with == 400 else "api_error",
                "message": "simulated failure"}})
        key = request.headers.get("Idempotency-Key", "")
        if key in self.by_idempotency_key:  # Stripe replays the first answer
            return 200, {}, json.dumps(self.sessions[self.by_idempotency_key[key]])
        session_id = "cs_test_" + secrets.token_hex(12)
        price_amount = body.get("line_items[0][price_data][unit_amount]")
        quantity = int(body.get("line_items[0][quantity]", "1"))
        self.sessions[session_id] = {
            "id": session_id, "object": "checkout.session",
            "url": f"{CHECKOUT_HOST}/c/pay/{session_id}",
            "status": "open", "payment_status": "unpaid", "mode": body["mode"],
            "amount_total": int(price_amount) * quantity if price_amount else 500 * quantity,
            "currency": body.get("line_items[0][price_data][currency]", "eur"),
            "payment_intent": None, "subscription": None,
            "client_reference_id": body.get("client_reference_id"),
            "metadata": {"elicitation_id": body.get("metadata[elicitation_id]"),
                         "client_id": body.get("metadata[client_id]")},
            "success_url": body["success_url"], "cancel_url": body["cancel_url"],
            "expires_at": int(body["expires_at"]),
        }
        self.by_idempotency_key[key] = session_id
        return 200, {}, json.dumps(self.sessions[session_id])

    def _retrieve(self, request: PreparedRequest) -> tuple[int, dict[str, str], str]:
        session_id = (request.path_url or "").split("?")[0].rsplit("/", 1)[-1]
        self.retrieved.append(session_id)
        found = self.sessions.get(session_id)
        if found is None:
            return 404, {}, json.dumps({"error": {"type": "invalid_request_error",
                                                  "message": "No such checkout.session"}})
        return 200, {}, json.dumps(found)

    # What a user and their bank do on Stripe's side.

    def only_session(self) -> dict[str, Any]:
        assert len(self.sessions) == 1, self.sessions
        return next(iter(self.sessions.values()))

    def pay(self, session_id: str, *, delayed: bool = False) -> dict[str, Any]:
        """The user pays: by card (paid now) or by a delayed method (unpaid until it clears)."""
        session = self.sessions[session_id]
        intent = "pi_test_" + secrets.token_hex(8)
        session.update(status="complete", payment_status="unpaid" if delayed else "paid",
                       payment_intent=intent if session["mode"] == "payment" else None,
                       subscription=("sub_test_" + secrets.token_hex(8)
                                     if session["mode"] == "subscription" else None))
        return session

    def clear(self, session_id: str) -> dict[str, Any]:
        """The delayed payment arrives."""
        self.sessions[session_id]["payment_status"] = "paid"
        return self.sessions[session_id]

    def expire(self, session_id: str) -> dict[str, Any]:
        self.sessions[session_id].update(status="expired")
        return self.sessions[session_id]


def _session_url_pattern() -> Any:
    import re

    return re.compile(re.escape(STRIPE_API) + r"/v1/checkout/sessions/cs_[A-Za-z0-9_]+")


def _text(body: str | bytes | None) -> str:
    if body is None:
        return ""
    return body.decode() if isinstance(body, bytes) else body


@pytest.fixture
def wire() -> Iterator[responses.RequestsMock]:
    """Every ``requests`` call of the test answered here; anything unregistered fails."""
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


@pytest.fixture
def stripe_api(wire: responses.RequestsMock) -> FakeStripe:
    fake = FakeStripe(wire)
    fake.install()
    return fake


# --- Stripe's events, signed ------------------------------------------------------


def stripe_signature(payload: bytes, secret: str, timestamp: int) -> str:
    """``Stripe-Signature`` by Stripe's documented scheme: HMAC-SHA256 of ``t.body``, hex."""
    signed = f"{timestamp}.".encode() + payload
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def event_body(event_type: str, session: dict[str, Any], event_id: str | None = None) -> bytes:
    return json.dumps({
        "id": event_id or "evt_" + secrets.token_hex(12), "object": "event",
        "api_version": "2026-10-28.endive", "created": int(time.time()), "livemode": False,
        "type": event_type, "data": {"object": dict(session)},
    }).encode()


@dataclass
class StripeWebhook:
    """Stripe, calling the gateway's webhook."""

    client: FlaskClient

    def send(self, event_type: str, session: dict[str, Any], *, event_id: str | None = None,
             secret: str = STRIPE_WEBHOOK_SECRET, age: int = 0,
             signature: str | None = None) -> TestResponse:
        payload = event_body(event_type, session, event_id)
        return self.post(payload, signature if signature is not None else stripe_signature(
            payload, secret, int(time.time()) - age))

    def post(self, payload: bytes, signature: str | None) -> TestResponse:
        headers = {"Content-Type": "application/json"}
        if signature is not None:
            headers["Stripe-Signature"] = signature
        return self.client.post("/stripe/webhook", data=payload, headers=headers)


@pytest.fixture
def stripe_webhook(client: FlaskClient) -> StripeWebhook:
    return StripeWebhook(client)


# --- the MCP server and its users -----------------------------------------------------


@pytest.fixture
def mcp_server(register: Callable[..., Registered], receiver: Receiver) -> Registered:
    """The MCP server that asks for payments; it has a webhook receiver."""
    return register("Weather Forecasts", webhook_url=receiver.url)


@pytest.fixture
def mcp_api(client: FlaskClient, mcp_server: Registered) -> Api:
    return Api(client, mcp_server.api_token)


def amount_payment(**changes: Any) -> dict[str, Any]:
    return {"amount": 1999, "currency": "usd", "description": "Forecast report, one month",
            **changes}


@pytest.fixture
def ask_payment(mcp_api: Api, settings: Settings) -> Callable[..., dict[str, Any]]:
    """A payment elicitation for a local user, as their MCP server creates it."""

    def make(username: str, payment: dict[str, Any] | None = None,
             **changes: Any) -> dict[str, Any]:
        response = mcp_api.post("/api/v1/elicitations", {
            "subject": {"iss": settings.public_url, "sub": username}, "kind": "payment",
            "message": "Pay for the forecast report", "reuse_pending": False,
            "payment": payment or amount_payment(), **changes})
        assert response.status_code == 201, response.get_data(as_text=True)
        created: dict[str, Any] = response.get_json()
        return created

    return make


@pytest.fixture
def logged_in(app: Flask) -> Callable[[str], Browser]:
    """A new browser, logged in as ``username``."""

    def make(username: str) -> Browser:
        user = Browser(client_for(app))
        assert user.log_in(username).status_code == 303
        return user

    return make


def start_checkout(user: Browser, elicitation_id: str) -> TestResponse:
    """Open the payment page and press its button, as the user does."""
    return user.post_form(f"/e/{elicitation_id}/checkout", {}, page=f"/e/{elicitation_id}")


# --- what the database holds ----------------------------------------------------------


@dataclass
class Records:
    app: Flask

    def elicitation(self, elicitation_id: str) -> Elicitation:
        with self.app.app_context():
            found = db.session().get(Elicitation, elicitation_id)
            assert found is not None
            return found

    def payments(self, elicitation_id: str) -> list[Payment]:
        with self.app.app_context():
            return list(db.session().scalars(select(Payment).where(
                Payment.elicitation_id == elicitation_id).order_by(Payment.attempt)))

    def events(self, elicitation_id: str) -> list[dict[str, Any]]:
        """The webhook events for the MCP server, oldest first, as their bodies."""
        with self.app.app_context():
            rows = db.session().scalars(select(WebhookEvent).where(
                WebhookEvent.elicitation_id == elicitation_id)
                .order_by(WebhookEvent.created_at)).all()
            return [json.loads(row.body) for row in rows]

    def stripe_events(self) -> list[StripeEvent]:
        with self.app.app_context():
            return list(db.session().scalars(select(StripeEvent)))


@pytest.fixture
def records(app: Flask) -> Records:
    return Records(app)
