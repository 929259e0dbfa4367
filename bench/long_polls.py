"""Held long-polls on the default ``gateway serve``: how many, and how soon each ends.

    .venv/bin/python bench/long_polls.py [--database sqlite|postgres] [--held N]
                                         [--ends N] [--crowd N] [--workers N]

Starts ``gateway serve`` as an operator would (one worker per CPU, its
default ``--waits``), creates ``--held`` pending elicitations, each for a user
of its own, and holds one ``?wait=60`` poll on each, sent again whenever it is
answered while still pending. Then, while they are held:

1. ``--ends`` of them are cancelled through the API, one at a time, by
   another connection; for each, the time from the cancel's answer to the
   answer of the poll held on it (the wake-up);
2. with ``--crowd``, that many more polls wait on one elicitation, which is
   then cancelled: the time until the last of them is answered.

It prints what it measured; nothing fails on a slow figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import ssl
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import servers
from hold import wire_bytes
from scenarios import ELICITATIONS, Gateway, Request, _api_token, _create_body

from gateway.serving.cli import default_workers

POLL_WAIT_S = 60
# Connections creating the elicitations, and how many polls start at once.
CREATORS = 32
OPENING_AT_ONCE = 200


@dataclass
class Polls:
    """The polls held, and when each elicitation's poll was answered with its end."""

    host: str
    port: int
    token: str
    context: ssl.SSLContext
    ended: dict[str, float] = field(default_factory=dict)
    # Answers while still pending: a wait that ran its course, sent again.
    pending: int = 0
    errors: int = 0
    reconnects: int = 0

    def request(self, elicitation_id: str) -> bytes:
        return wire_bytes(Request("GET", f"{ELICITATIONS}/{elicitation_id}?wait={POLL_WAIT_S}",
                                  headers={"Authorization": f"Bearer {self.token}"}),
                          self.host, self.port)

    async def hold(self, elicitation_id: str, started: asyncio.Event) -> None:
        """Poll until the elicitation ends; note when its end was answered."""
        wire = self.request(elicitation_id)
        first = True
        while True:
            try:
                reader, writer = await asyncio.open_connection(
                    self.host, self.port, ssl=self.context, server_hostname="localhost")
            except OSError:
                self.errors += 1
                await asyncio.sleep(0.5)
                continue
            try:
                while True:
                    writer.write(wire)
                    await writer.drain()
                    if first:
                        started.set()
                        first = False
                    body = await read_body(reader)
                    if json.loads(body)["status"] != "pending":
                        self.ended[elicitation_id] = time.monotonic()
                        return
                    self.pending += 1
            except (OSError, asyncio.IncompleteReadError, ValueError):
                self.reconnects += 1
            finally:
                writer.close()


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One answer's status and body (the gateway always sends Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return int(head.split(b" ", 2)[1]), await reader.readexactly(length)


async def read_body(reader: asyncio.StreamReader) -> bytes:
    return (await read_answer(reader))[1]


async def api(gateway: Gateway, token: str, context: ssl.SSLContext, method: str, path: str,
              body: dict[str, Any] | None = None) -> tuple[int, bytes]:
    """One request on a connection of its own."""
    request = Request.with_json(method, path, body) if body is not None else \
        Request(method, path)
    request = request.with_header("Authorization", f"Bearer {token}")
    reader, writer = await asyncio.open_connection(gateway.host, gateway.port, ssl=context,
                                                   server_hostname="localhost")
    try:
        writer.write(wire_bytes(request, gateway.host, gateway.port))
        await writer.drain()
        return await read_answer(reader)
    finally:
        writer.close()


async def create_many(gateway: Gateway, token: str, context: ssl.SSLContext,
                      count: int) -> list[str]:
    ids: list[str] = []
    queue = list(range(count))

    async def creator() -> None:
        while queue:
            number = queue.pop()
            body = _create_body(f"Held poll {number}", ttl_seconds=3600)
            body["subject"] = {**body["subject"], "sub": f"held-{number}"}
            status, answer = await api(gateway, token, context, "POST", ELICITATIONS, body)
            if status != 201:
                raise SystemExit(f"creating an elicitation answered {status}: {answer[:200]!r}")
            ids.append(json.loads(answer)["id"])
    await asyncio.gather(*(creator() for _ in range(CREATORS)))
    return ids


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def measure(gateway: Gateway, args: argparse.Namespace) -> None:
    context = ssl.create_default_context(cafile=str(gateway.cafile))
    token = _api_token(gateway, "bench-long-polls")
    started_at = time.monotonic()
    ids = await create_many(gateway, token, context, args.held + 1)
    print(f"created {len(ids)} elicitations in {time.monotonic() - started_at:.1f} s",
          flush=True)
    crowded, ids = ids[0], ids[1:]
    polls = Polls(gateway.host, gateway.port, token, context)
    tasks: list[asyncio.Task[None]] = []
    started_at = time.monotonic()
    for start in range(0, len(ids), OPENING_AT_ONCE):
        batch = [asyncio.Event() for _ in ids[start:start + OPENING_AT_ONCE]]
        tasks += [asyncio.create_task(polls.hold(elicitation_id, event))
                  for elicitation_id, event in zip(ids[start:], batch, strict=False)]
        await asyncio.gather(*(event.wait() for event in batch))
    print(f"{len(ids)} polls sent in {time.monotonic() - started_at:.1f} s "
          f"({polls.errors} connection errors)", flush=True)
    await asyncio.sleep(5)  # taken in and parked
    pending_before = polls.pending

    wakes: list[float] = []
    for elicitation_id in ids[:args.ends]:
        await api(gateway, token, context, "POST", f"{ELICITATIONS}/{elicitation_id}/cancel")
        cancelled_at = time.monotonic()
        deadline = cancelled_at + 30
        while elicitation_id not in polls.ended and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        if elicitation_id in polls.ended:
            wakes.append(max(0.0, polls.ended[elicitation_id] - cancelled_at))
        await asyncio.sleep(0.2)
    late = args.ends - len(wakes)
    print(f"\nwith {len(ids)} polls held ({polls.pending - pending_before} answered "
          f"while pending meanwhile, {polls.reconnects} reconnects):")
    if wakes:
        print(f"  {len(wakes)} ends answered: wake-up "
              f"p50 {statistics.median(wakes) * 1000:.0f} ms, "
              f"p99 {percentile(wakes, 0.99) * 1000:.0f} ms, max {max(wakes) * 1000:.0f} ms"
              f"{f', {late} not answered within 30 s' if late else ''}", flush=True)

    if args.crowd:
        crowd = Polls(gateway.host, gateway.port, token, context)
        answers: list[float] = []
        events = [asyncio.Event() for _ in range(args.crowd)]

        async def one(event: asyncio.Event) -> None:
            reader, writer = await asyncio.open_connection(
                gateway.host, gateway.port, ssl=context, server_hostname="localhost")
            try:
                writer.write(crowd.request(crowded))
                await writer.drain()
                event.set()
                await read_body(reader)
                answers.append(time.monotonic())
            finally:
                writer.close()
        crowd_tasks = []
        for start in range(0, args.crowd, OPENING_AT_ONCE):
            batch = events[start:start + OPENING_AT_ONCE]
            crowd_tasks += [asyncio.create_task(one(event)) for event in batch]
            await asyncio.gather(*(event.wait() for event in batch))
        await asyncio.sleep(5)
        await api(gateway, token, context, "POST", f"{ELICITATIONS}/{crowded}/cancel")
        cancelled_at = time.monotonic()
        await asyncio.wait(crowd_tasks, timeout=60)
        after = [moment - cancelled_at for moment in answers if moment >= cancelled_at]
        if after:
            print(f"  {len(after)} of {args.crowd} polls on one elicitation answered after "
                  f"its end: p50 {statistics.median(after):.2f} s, last {max(after):.2f} s")
        for task in crowd_tasks:
            task.cancel()

    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--held", type=int, default=10_000)
    parser.add_argument("--ends", type=int, default=50)
    parser.add_argument("--crowd", type=int, default=0)
    parser.add_argument("--workers", type=int, default=default_workers())
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gateway-polls-")))
        database_url = stack.enter_context(servers.scratch_database(args.database))
        instance = folder / "instance"
        port = servers.free_port()
        environ = servers.scratch_environ(instance, port, database_url)
        servers.init_instance(environ, folder)
        options = servers.gateway_options(port, args.workers, 10_000, instance)
        gateway = stack.enter_context(servers.run_gateway(environ, folder, options))
        print(f"gateway serve: {args.workers} workers, {servers.describe_database(database_url)}",
              flush=True)
        asyncio.run(measure(gateway, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
