"""Long-polls held by the real ``gateway serve``: many per worker, each woken at its end.

A held ``?wait=`` is a greenlet, not a thread: a worker holds hundreds while
it answers everything else, lets a poll go the moment its elicitation ends
(on this instance or another one on the same database) or its client hangs
up, and answers at once, with the current state, past its ``--waits``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gateway.serving.tls import dev_certificate_paths
from tests.integration.conftest import Result, Server, tls_context

pytestmark = pytest.mark.slow

ISSUER = "https://idp.example.com"


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    seconds: float


@dataclass
class Gateway:
    """One running ``gateway serve`` and an API token for it."""

    server: Server
    token: str
    context: ssl.SSLContext

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None,
                   ) -> Answer:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", self.server.port, ssl=self.context, server_hostname="localhost")
        try:
            return await exchange(reader, writer, self.token, method, path, body)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def run(self, method: str, path: str, body: dict[str, Any] | None = None) -> Answer:
        return asyncio.run(self.call(method, path, body))

    def create(self) -> str:
        # A user of its own each: an open one for the same user would be reused.
        created = self.run("POST", "/api/v1/elicitations", {
            "subject": {"iss": ISSUER, "sub": secrets.token_hex(8)},
            "kind": "api_key", "credential_type": "generic",
            "message": "Connect your weather API key"})
        assert created.status == 201, created
        return str(created.body["id"])

    def cancel(self, elicitation_id: str) -> None:
        cancelled = self.run("POST", f"/api/v1/elicitations/{elicitation_id}/cancel")
        assert cancelled.status == 200, cancelled


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: str,
                   method: str, path: str, body: dict[str, Any] | None) -> Answer:
    started = time.monotonic()
    payload = json.dumps(body).encode() if body is not None else b""
    head = (f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: {len(payload)}\r\n")
    if body is not None:
        head += "Content-Type: application/json\r\n"
    writer.write(head.encode() + b"\r\n" + payload)
    await writer.drain()
    status_line = await reader.readline()
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    data = await reader.readexactly(length)
    return Answer(int(status_line.split()[1]), json.loads(data) if data else {},
                  time.monotonic() - started)


@dataclass
class Held:
    """Polls held in a background event loop; each answer is kept as it comes."""

    gateway: Gateway
    answers: dict[str, list[Answer]] = field(default_factory=dict)
    sent: int = 0
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    tasks: list[asyncio.Task[Answer]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def poll(self, elicitation_id: str, count: int, wait: int = 60) -> None:
        """Send ``count`` polls and return once every one of them is sent."""
        async def send_all() -> None:
            await asyncio.gather(*(self._one(elicitation_id, wait) for _ in range(count)))
        asyncio.run_coroutine_threadsafe(send_all(), self.loop).result(timeout=60)

    async def _one(self, elicitation_id: str, wait: int) -> None:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", self.gateway.server.port, ssl=self.gateway.context,
            server_hostname="localhost")
        request = exchange(reader, writer, self.gateway.token, "GET",
                           f"/api/v1/elicitations/{elicitation_id}?wait={wait}", None)
        task = self.loop.create_task(request)
        self.writers.append(writer)
        self.tasks.append(task)
        self.sent += 1

        def keep(done: asyncio.Task[Answer]) -> None:
            writer.close()
            if not done.cancelled() and done.exception() is None:
                self.answers.setdefault(elicitation_id, []).append(done.result())
        task.add_done_callback(keep)
        await asyncio.sleep(0)  # the request is on its way

    def answered(self, elicitation_id: str) -> list[Answer]:
        return list(self.answers.get(elicitation_id, []))

    def until(self, elicitation_id: str, count: int, timeout: float) -> list[Answer]:
        deadline = time.monotonic() + timeout
        while len(self.answered(elicitation_id)) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.answered(elicitation_id)

    def close(self) -> None:
        async def hang_up() -> None:
            for task in self.tasks:
                task.cancel()
            for writer in self.writers:
                writer.close()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            for writer in self.writers:
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
        asyncio.run_coroutine_threadsafe(hang_up(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def gateway_with(start_server: Callable[..., Server], invoke_gateway: Callable[..., Result],
                 instance_path: Path) -> Callable[..., Gateway]:
    minted: list[str] = []

    def start(*args: str) -> Gateway:
        if not minted:
            created = invoke_gateway("clients", "create", "Waiting MCP", "--webhook-url",
                                     "https://mcp.example.com/hooks", "--json")
            minted.append(json.loads(created.stdout)["api_token"])
        server = start_server("--no-worker", *args)
        return Gateway(server, minted[0], tls_context(dev_certificate_paths(instance_path)[0]))
    return start


@contextmanager
def holding(gateway: Gateway) -> Iterator[Held]:
    held = Held(gateway)
    try:
        yield held
    finally:
        held.close()


def settle() -> None:
    # The polls sent have reached their wait (each is a read, then a park).
    time.sleep(1.5)


def test_one_worker_holds_hundreds_of_polls_and_answers_the_rest_meanwhile(
    gateway_with: Callable[..., Gateway],
) -> None:
    gateway = gateway_with("--waits", "1000")
    crowded, single, other = gateway.create(), gateway.create(), gateway.create()
    with holding(gateway) as held:
        held.poll(crowded, 400)
        held.poll(single, 1)
        settle()
        assert held.answered(crowded) == []
        assert held.answered(single) == []

        read = gateway.run("GET", f"/api/v1/elicitations/{other}")
        assert read.status == 200
        assert read.seconds < 1, read
        assert gateway.create()

        gateway.cancel(single)
        woken = held.until(single, 1, timeout=5)
        assert [answer.body["status"] for answer in woken] == ["cancelled"]
        assert woken[0].seconds > 1.5, "the poll was answered before its elicitation ended"
        assert held.answered(crowded) == [], "polls on another elicitation were let go"

        ended_at = time.monotonic()
        gateway.cancel(crowded)
        everyone = held.until(crowded, 400, timeout=10)
        took = time.monotonic() - ended_at
    assert len(everyone) == 400
    assert {answer.body["status"] for answer in everyone} == {"cancelled"}
    assert took < 10


def assert_woken_within_a_second(waiting_on: Gateway, ending_on: Gateway) -> None:
    """A poll held on ``waiting_on`` answers within 1 s of ``ending_on`` ending its elicitation."""
    elicitation = waiting_on.create()
    with holding(waiting_on) as held:
        held.poll(elicitation, 1)
        settle()
        ended_at = time.monotonic()
        ending_on.cancel(elicitation)
        woken = held.until(elicitation, 1, timeout=5)
        assert woken
        assert woken[0].body["status"] == "cancelled"
        assert time.monotonic() - ended_at < 1


def test_a_poll_is_answered_within_a_second_of_its_end(
    gateway_with: Callable[..., Gateway],
) -> None:
    gateway = gateway_with()
    assert_woken_within_a_second(gateway, gateway)


def test_polls_past_the_waits_are_answered_at_once_with_the_current_state(
    gateway_with: Callable[..., Gateway],
) -> None:
    gateway = gateway_with("--waits", "2")
    elicitation = gateway.create()
    with holding(gateway) as held:
        held.poll(elicitation, 2)
        settle()
        assert held.answered(elicitation) == []
        third = gateway.run("GET", f"/api/v1/elicitations/{elicitation}?wait=30")
    assert third.status == 200
    assert third.body["status"] == "pending"
    assert third.seconds < 1


def test_a_held_poll_whose_client_hangs_up_frees_its_place(
    gateway_with: Callable[..., Gateway],
) -> None:
    gateway = gateway_with("--waits", "1")
    elicitation = gateway.create()

    async def hang_up() -> None:
        _reader, writer = await asyncio.open_connection(
            "127.0.0.1", gateway.server.port, ssl=gateway.context, server_hostname="localhost")
        writer.write(f"GET /api/v1/elicitations/{elicitation}?wait=60 HTTP/1.1\r\n"
                     f"Host: localhost\r\nAuthorization: Bearer {gateway.token}\r\n\r\n"
                     .encode())
        await writer.drain()
        await asyncio.sleep(1.5)  # held
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    asyncio.run(hang_up())
    time.sleep(0.5)

    # Its one place is free again: the next poll is held until its time is up.
    next_poll = gateway.run("GET", f"/api/v1/elicitations/{elicitation}?wait=3")
    assert next_poll.body["status"] == "pending"
    assert next_poll.seconds > 2.5, "the place of the poll whose client left was still taken"


def test_an_end_recorded_by_another_instance_wakes_the_poll(
    gateway_with: Callable[..., Gateway],
) -> None:
    assert_woken_within_a_second(gateway_with(), gateway_with())
