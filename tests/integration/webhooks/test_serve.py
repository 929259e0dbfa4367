"""`gateway serve` sends webhooks through its own worker, and not with --no-worker."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from flask import Flask

from gateway.client import verify_webhook
from tests.conftest import Registered
from tests.integration.api.test_create import body
from tests.integration.conftest import Result, Server
from tests.integration.test_clients_cli import Https
from tests.integration.webhooks.conftest import Receiver, events

pytestmark = pytest.mark.slow


def cancel_over_https(https: Https) -> str:
    status, created = https.call("POST", "/api/v1/elicitations", body(metadata={"run": "e2e"}))
    assert status == 201, created
    status, cancelled = https.call("POST", f"/api/v1/elicitations/{created['id']}/cancel")
    assert status == 200, cancelled
    elicitation_id: str = created["id"]
    return elicitation_id


def worker_of(server: Server, other_than: int | None = None, timeout: float = 30) -> int:
    """The pid of the `gateway worker` process the server runs (once it runs one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # A child belongs to the thread that started it: look under every thread.
        for children in Path(f"/proc/{server.process.pid}/task").glob("*/children"):
            for pid in children.read_text().split():
                try:
                    command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except FileNotFoundError:
                    continue
                if command[1:4] == [b"-m", b"gateway", b"worker"] and int(pid) != other_than:
                    return int(pid)
        time.sleep(0.1)
    raise AssertionError(f"no worker process (other than {other_than}):\n{server.output()}")


def test_serve_delivers_a_cancellation_through_its_worker(
    app: Flask, hooked: Registered, receiver: Receiver, start_server: Callable[..., Server],
    instance_path: Path,
) -> None:
    server = start_server()
    elicitation_id = cancel_over_https(Https(server, instance_path, hooked.api_token))

    [delivery] = receiver.wait_for(1, timeout=20)
    payload = verify_webhook(hooked.webhook_secret, delivery.headers, delivery.body)
    assert payload["type"] == "elicitation.cancelled"
    assert payload["data"]["elicitation_id"] == elicitation_id
    assert payload["data"]["metadata"] == {"run": "e2e"}
    [event] = events(app)
    assert delivery.headers["webhook-id"] == event.id
    deadline = time.monotonic() + 10
    while events(app)[0].status != "delivered" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert events(app)[0].status == "delivered"
    assert "worker started" in server.output()


def test_serve_without_worker_leaves_the_event_to_a_worker(
    app: Flask, hooked: Registered, receiver: Receiver, start_server: Callable[..., Server],
    instance_path: Path, invoke_gateway: Callable[..., Result],
) -> None:
    server = start_server("--no-worker")
    cancel_over_https(Https(server, instance_path, hooked.api_token))

    time.sleep(3)  # a worker would have sent it well within this
    assert receiver.deliveries == []
    [event] = events(app)
    assert (event.status, event.attempts) == ("pending", 0)
    assert "worker started" not in server.output()

    # The event was waiting in the outbox all along: any worker sends it.
    sent = invoke_gateway("worker", "--once")
    assert sent.code == 0, sent.stderr
    assert "attempted 1 webhook(s)" in sent.stdout
    [delivery] = receiver.deliveries
    assert delivery.headers["webhook-id"] == event.id
    assert json.loads(delivery.body)["type"] == "elicitation.cancelled"
    assert events(app)[0].status == "delivered"


def test_a_killed_worker_is_started_again_and_sends_the_webhook(
    app: Flask, hooked: Registered, receiver: Receiver, start_server: Callable[..., Server],
    instance_path: Path,
) -> None:
    server = start_server()
    killed = worker_of(server)
    os.kill(killed, signal.SIGKILL)
    replacement = worker_of(server, other_than=killed)
    elicitation_id = cancel_over_https(Https(server, instance_path, hooked.api_token))

    # The first wait after a death is a second; the new worker's start adds a few.
    [delivery] = receiver.wait_for(1, timeout=20)
    payload = verify_webhook(hooked.webhook_secret, delivery.headers, delivery.body)
    assert payload["data"]["elicitation_id"] == elicitation_id
    output = server.output()
    assert f"started the worker (pid {killed})" in output
    assert f"the worker (pid {killed}) stopped after" in output
    assert "starting another in 1 s" in output
    assert f"started the worker (pid {replacement})" in output


def test_the_worker_stops_when_its_server_is_killed_outright(
    start_server: Callable[..., Server],
) -> None:
    server = start_server()
    orphan = worker_of(server)
    # SIGKILL: the server cannot stop its worker; the worker must notice by itself.
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait()
    deadline = time.monotonic() + 20
    while Path(f"/proc/{orphan}").exists() and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(orphan, os.WNOHANG)  # reaped here if it was handed to this process
        time.sleep(0.2)
    status = Path(f"/proc/{orphan}/status")
    alive = status.exists() and "State:\tZ" not in status.read_text()
    assert not alive, f"the worker (pid {orphan}) went on after its server was killed"
    assert "is gone; stopping" in server.output()
