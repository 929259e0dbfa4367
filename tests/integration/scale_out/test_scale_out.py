"""Scale-out, proven: two instances and two workers on one PostgreSQL and one Redis.

Each test starts the deployment afresh (see conftest.py) and checks one
promise of "any number of ``gateway serve --no-worker`` behind a balancer
plus any number of ``gateway worker``": no state lives in a process.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
from flask import Flask
from playwright.sync_api import BrowserContext, Page, expect

from gateway.client import verify_webhook
from gateway.webhooks.models import WebhookEvent
from tests.browser.conftest import log_in
from tests.conftest import Registered
from tests.integration.scale_out.conftest import (
    API_LIMIT,
    LEASE_SECONDS,
    PUBLIC_URL,
    Deployment,
    Instance,
    Instances,
    LongPoll,
    owner_of_port,
)
from tests.integration.webhooks.conftest import Answer, Fault, Receiver, attempts, events

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.environ.get("TEST_DATABASE_URL", "").startswith("postgresql"),
        reason="scale-out needs PostgreSQL, the database instances on several hosts share "
               "(set TEST_DATABASE_URL; ./dev test runs the suite on PostgreSQL too)"),
]


def ask_for_key(instance: Instance, mcp: Registered, username: str) -> dict[str, Any]:
    """An API-key elicitation for ``username``, created through ``instance``'s API."""
    created = instance.api("POST", "/api/v1/elicitations", mcp.api_token, {
        "subject": {"iss": PUBLIC_URL, "sub": username}, "kind": "api_key",
        "credential_type": "generic", "message": "Connect your weather API key",
        "reuse_pending": False})
    assert created.status == 201, created.body
    elicitation: dict[str, Any] = created.body
    return elicitation


def on(instance: Instance, elicitation: dict[str, Any]) -> str:
    """The elicitation's link, as served by ``instance`` instead of the balancer."""
    return instance.url(urlsplit(elicitation["url"]).path)


def new_key() -> str:
    return f"wx-live-{secrets.token_hex(12)}"


def save_key(page: Page, key: str) -> float:
    """Type ``key`` into the open capture page and save it; when it was sent (monotonic)."""
    page.get_by_label("API key").fill(key)
    with page.expect_navigation():
        sent_at = time.monotonic()
        page.get_by_role("button", name="Save key").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Done")
    return sent_at


def status_on(instance: Instance, mcp: Registered, elicitation_id: str) -> str:
    read = instance.api("GET", f"/api/v1/elicitations/{elicitation_id}", mcp.api_token)
    assert read.status == 200, read.body
    status: str = read.body["status"]
    return status


def all_delivered(app: Flask, count: int, timeout: float = 15) -> list[WebhookEvent]:
    """The outbox once it holds ``count`` events, every one recorded as delivered."""
    deadline = time.monotonic() + timeout
    while True:
        found = events(app)
        if len(found) == count and all(event.status == "delivered" for event in found):
            return found
        if time.monotonic() > deadline:
            raise AssertionError("the outbox did not settle: " + ", ".join(
                f"{event.id} {event.status} after {event.attempts} attempt(s)"
                for event in found))
        time.sleep(0.1)


def end_elsewhere(deployment: Deployment, mcp: Registered, count: int) -> None:
    """Create and cancel ``count`` elicitations, on A and B in turn: events for the workers."""
    for number in range(count):
        instance = (deployment.a, deployment.b)[number % 2]
        elicitation = ask_for_key(instance, mcp, f"someone-else-{number}")
        cancelled = instance.api("POST", f"/api/v1/elicitations/{elicitation['id']}/cancel",
                                 mcp.api_token)
        assert cancelled.status == 200, cancelled.body


def test_made_on_a_completed_in_a_browser_on_b_heard_on_a_at_once_sent_once_per_attempt(
    deployment: Deployment, receiver: Receiver, app: Flask,
    register: Callable[..., Registered], create_user: Callable[[], str],
    context: BrowserContext,
) -> None:
    a, b = deployment.a, deployment.b
    mcp = register(webhook_url=receiver.url)
    username = create_user()
    elicitation = ask_for_key(a, mcp, username)
    # Other events for the two workers to compete over; the first delivery
    # fails, so one event is sent twice (its retry comes about 5 s later).
    receiver.script = [Answer(503)]
    others = 8
    end_elsewhere(deployment, mcp, others)
    waiting = LongPoll(a, mcp.api_token, elicitation["id"], wait=30)
    waiting.start()

    page = context.new_page()
    page.goto(on(b, elicitation))
    expect(page).to_have_url(re.compile(re.escape(b.url("/login?next="))))
    log_in(page, username)
    expect(page).to_have_url(on(b, elicitation))
    assert waiting.is_alive(), "the long-poll on A returned before the key was submitted"
    key = new_key()
    # The completion commits between this moment and the page's answer, so the
    # gap measured from here is the longest it can have been.
    submitted_at = save_key(page, key)
    waiting.join(timeout=35)

    # 1. B opened and completed what A created; A's API sees the result.
    submit = f'"POST /e/{elicitation["id"]} '
    assert submit in b.server.output(), "the key was not submitted to instance B"
    assert submit not in a.server.output(), "the key was submitted to instance A too"
    assert status_on(a, mcp, elicitation["id"]) == "completed", \
        "instance A does not see the completion made on instance B"
    [credential] = a.api("GET", f"/api/v1/credentials?subject_sub={username}",
                         mcp.api_token).body["items"]
    revealed = a.api("POST", f"/api/v1/credentials/{credential['id']}/reveal", mcp.api_token)
    assert revealed.body["secret"] == key, "instance A reveals another key than was typed on B"

    # 2. The long-poll held on A was woken by the completion on B.
    assert waiting.reply is not None, "the long-poll on A never returned"
    assert waiting.reply.body["status"] == "completed", \
        f"the long-poll on A returned {waiting.reply.body['status']!r}, not 'completed'"
    gap = waiting.returned_at - submitted_at
    assert gap < 1.0, f"the long-poll on A returned {gap:.2f} s after the key was saved on B"

    # 3. Each attempt of each event reached the receiver once, whichever worker sent it.
    receiver.wait_for(others + 2, timeout=20)
    settled = all_delivered(app, others + 1)
    per_attempt = {event.id: event.attempts for event in settled}
    assert Counter(receiver.ids()) == per_attempt, \
        "deliveries per webhook-id differ from the attempts the two workers recorded"
    assert sorted(per_attempt.values()) == [1] * others + [2], per_attempt
    retried = max(per_attempt, key=lambda event_id: per_attempt[event_id])
    assert [(attempt.number, attempt.outcome) for attempt in attempts(app, retried)] == [
        (1, "failed"), (2, "delivered")]
    payloads = [verify_webhook(mcp.webhook_secret, delivery.headers, delivery.body)
                for delivery in receiver.deliveries]
    completions = [payload["data"]["elicitation_id"] for payload in payloads
                   if payload["type"] == "elicitation.completed"]
    assert elicitation["id"] in completions, "the completion webhook never arrived"


def test_the_rate_limit_counts_requests_on_both_instances(
    instances: Instances, register: Callable[..., Registered],
) -> None:
    a, b = instances.a, instances.b
    token = register().api_token  # a fresh token: its counter starts at zero
    spent_on_a = API_LIMIT // 2
    for _ in range(spent_on_a):
        assert a.api("GET", "/api/v1/elicitations", token).status == 200
    first_on_b = b.api("GET", "/api/v1/elicitations", token)
    assert first_on_b.status == 200
    assert first_on_b.headers["X-RateLimit-Remaining"] == str(API_LIMIT - spent_on_a - 1), \
        "instance B does not count the requests made on instance A"
    for _ in range(API_LIMIT - spent_on_a - 1):
        assert b.api("GET", "/api/v1/elicitations", token).status == 200

    for instance in (a, b):
        refused = instance.api("GET", "/api/v1/elicitations", token)
        assert refused.status == 429, \
            f"instance {instance.name} let request {API_LIMIT + 1} of a {API_LIMIT}/minute " \
            "token through"
        assert refused.headers["Content-Type"] == "application/problem+json"
        assert 0 < int(refused.headers["Retry-After"]) <= 60


def test_killing_a_worker_mid_delivery_and_an_instance_loses_nothing(
    deployment: Deployment, receiver: Receiver, app: Flask,
    register: Callable[..., Registered], create_user: Callable[[], str],
    context: BrowserContext,
) -> None:
    a, b, workers = deployment.a, deployment.b, deployment.workers
    mcp = register(webhook_url=receiver.url)
    username = create_user()
    first, second, third = (ask_for_key(a, mcp, username) for _ in range(3))
    receiver.script = [Fault.HANG]  # the first delivery is held open: it is in flight

    page = context.new_page()
    page.goto(b.url("/login"))
    log_in(page, username)
    page.goto(on(b, first))
    save_key(page, new_key())
    [held] = receiver.wait_for(1)
    sender = owner_of_port(held.sender_port, [worker.pid for worker in workers])
    assert sender is not None, \
        "no worker holds the receiver's held request (did its send time out already?)"
    [dying] = [worker for worker in workers if worker.pid == sender]
    [surviving] = [worker for worker in workers if worker is not dying]
    dying.kill()
    b.kill()
    with pytest.raises(ConnectionRefusedError):
        b.api("GET", "/api/v1/elicitations", mcp.api_token)

    # The user carries on at A in the same browser: sessions live in the database.
    waiting = LongPoll(a, mcp.api_token, third["id"], wait=30)
    waiting.start()
    for elicitation in (second, third):
        page.goto(on(a, elicitation))
        save_key(page, new_key())
    waiting.join(timeout=35)
    assert waiting.reply is not None, "the long-poll on the surviving instance never returned"
    assert waiting.reply.body["status"] == "completed", \
        "the long-poll on the surviving instance did not return the completion"
    for elicitation in (first, second, third):
        assert status_on(a, mcp, elicitation["id"]) == "completed", \
            f"the surviving instance does not read {elicitation['id']} as completed"

    # Every event is delivered: the three completions (the held one again, with
    # the same webhook-id, by the surviving worker once the dead one's lease has
    # run out) and the revocations of the first two keys, each superseded by
    # the next.
    receiver.wait_for(6, timeout=LEASE_SECONDS + 15)
    settled = all_delivered(app, 5)
    assert Counter(receiver.ids()) == {event.id: event.attempts for event in settled}, \
        "deliveries per webhook-id differ from the attempts recorded"
    retried = held.headers["webhook-id"]
    assert [(attempt.number, attempt.outcome) for attempt in attempts(app, retried)] == [
        (2, "delivered")], "the killed worker's delivery was not taken over once"
    resent = [delivery for delivery in receiver.deliveries
              if delivery.headers["webhook-id"] == retried][-1]
    assert resent.body == held.body
    payloads = [verify_webhook(mcp.webhook_secret, delivery.headers, delivery.body)
                for delivery in receiver.deliveries]
    completed = {payload["data"]["elicitation_id"] for payload in payloads
                 if payload["type"] == "elicitation.completed"}
    assert completed == {first["id"], second["id"], third["id"]}, \
        "a completion's webhook was lost with the killed worker or instance"
    assert sorted(payload["data"]["reason"] for payload in payloads
                  if payload["type"] == "credential.revoked") == ["superseded"] * 2
    assert surviving.process.poll() is None, surviving.output()
