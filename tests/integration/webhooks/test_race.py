"""Two `gateway worker` processes racing over one outbox on PostgreSQL."""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy import func, select

from gateway import db
from gateway.clients.models import Client
from gateway.clock import SystemClock
from gateway.webhooks import outbox
from gateway.webhooks.models import WebhookAttempt, WebhookEvent
from tests.conftest import Registered
from tests.integration.webhooks.conftest import Receiver

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.environ.get("TEST_DATABASE_URL"),
                       reason="PostgreSQL only: SQLite takes one writer at a time, so claims "
                              "cannot race (set TEST_DATABASE_URL)"),
]

EVENTS = 1000
# urllib3 logs every request it sends at debug level: one line per attempt.
SENT_LINE = re.compile(r'"POST /hooks HTTP/1\.1" \d{3}')


def test_two_workers_deliver_a_thousand_events_once_each(
    app: Flask, hooked: Registered, receiver: Receiver, cli_environ: dict[str, str],
    tmp_path: Path,
) -> None:
    environ = {**cli_environ, "GATEWAY_LOG_LEVEL": "debug"}
    logs = [tmp_path / f"worker-{n}.log" for n in (1, 2)]
    workers = []
    for log in logs:
        with log.open("w") as output:
            workers.append(subprocess.Popen(
                [sys.executable, "-m", "gateway", "worker"], env=environ, cwd=tmp_path,
                stdout=output, stderr=subprocess.STDOUT))
    try:
        _wait_for_text(logs, "worker started")
        time.sleep(0.3)  # both in their loop, asleep on the change signal
        # A thousand events in one commit: both workers wake to the same rows.
        with app.app_context(), db.transaction() as session:
            client = session.get(Client, hooked.id)
            assert client is not None
            for n in range(EVENTS):
                outbox.enqueue(session, SystemClock(), client.id, client.webhook_url,
                               "elicitation.cancelled", {"n": n})
        delivered = _wait_for_delivered(app, EVENTS, timeout=30)
        assert delivered == EVENTS
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(timeout=20)

    with app.app_context():
        session = db.session()
        ids = set(session.scalars(select(WebhookEvent.id)))
        per_event = dict(session.execute(select(WebhookEvent.id, WebhookEvent.attempts)).all())
        logged = collections.Counter(session.scalars(select(WebhookAttempt.event_id)))
    assert len(ids) == EVENTS
    assert set(per_event.values()) == {1}
    assert logged == dict.fromkeys(ids, 1)
    arrived = collections.Counter(receiver.ids())
    assert set(arrived) == ids
    assert max(arrived.values()) == 1, "an event was sent twice"
    # And both took part: each worker sent some of them, together all, once.
    sent = [len(SENT_LINE.findall(log.read_text())) for log in logs]
    assert sum(sent) == EVENTS, sent
    assert min(sent) > 0, sent


def _wait_for_text(logs: list[Path], text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not all(text in log.read_text() for log in logs):
        if time.monotonic() > deadline:
            raise AssertionError("workers did not start:\n" + "\n".join(
                log.read_text()[-2000:] for log in logs))
        time.sleep(0.1)


def _wait_for_delivered(app: Flask, count: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        with app.app_context():
            done = db.session().scalar(select(func.count()).select_from(WebhookEvent).where(
                WebhookEvent.status == "delivered")) or 0
        if done >= count or time.monotonic() > deadline:
            return done
        time.sleep(0.2)
