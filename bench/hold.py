"""Held requests: N connections that each keep one request in flight, in the background.

While wrk measures a target, :class:`HeldRequests` keeps ``count`` requests
open against it: each connection sends the request, waits for the answer,
counts it and sends it again at once. Against a long-poll that waits 30 s this
parks ``count`` requests on the server the whole time, which is the load the
measurement is about; the counts say how many of them the server answered.

asyncio on raw TLS streams rather than threads: hundreds of mostly idle
connections cost one thread here, so the client does not compete with the
servers for the machine's few cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scenarios import Request

# Pause before reconnecting after an error, so a refusing server is not spun on.
RETRY_PAUSE_S = 0.2
# How long to wait for every connection to have sent its first request.
RAMP_TIMEOUT_S = 30.0

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class ResponseError(Exception):
    """The server's answer could not be read as HTTP/1.1."""


@dataclass(slots=True)
class HoldStats:
    """What the held requests saw against one target."""

    count: int
    sent: int = 0
    # Answers with the expected status, and the others by status.
    answered: int = 0
    unexpected: Counter[int] = field(default_factory=Counter)
    # Failed requests by error kind (connect refused, reset, timeout...).
    errors: Counter[str] = field(default_factory=Counter)
    # Requests still waiting for their answer when the hold stopped.
    open_at_stop: int = 0
    total_answer_s: float = 0.0
    slowest_answer_s: float = 0.0

    @property
    def mean_answer_s(self) -> float | None:
        """Mean time from sending a held request to its answer."""
        received = self.answered + sum(self.unexpected.values())
        return self.total_answer_s / received if received else None

    def summary(self) -> str:
        """One line for the table."""
        parts = [f"{self.count} held", f"{self.answered} answered"]
        parts += [f"{n} x {status}" for status, n in sorted(self.unexpected.items())]
        parts += [f"{n} {kind}" for kind, n in sorted(self.errors.items())]
        parts.append(f"{self.open_at_stop} open when stopped")
        if self.mean_answer_s is not None:
            parts.append(f"answer mean {self.mean_answer_s:.2f} s, "
                         f"max {self.slowest_answer_s:.2f} s")
        return ", ".join(parts)

    def as_json(self) -> dict[str, Any]:
        """The stats as plain JSON values."""
        return {
            "count": self.count,
            "sent": self.sent,
            "answered": self.answered,
            "unexpected_status": {str(k): v for k, v in self.unexpected.items()},
            "errors": dict(self.errors),
            "open_at_stop": self.open_at_stop,
            "mean_answer_s": self.mean_answer_s,
            "slowest_answer_s": self.slowest_answer_s,
        }


def wire_bytes(request: Request, host: str, port: int) -> bytes:
    """The request as HTTP/1.1 bytes, with Host and (for a body) Content-Length."""
    headers = {"Host": f"{host}:{port}", **request.headers}
    if request.body is not None:
        headers["Content-Length"] = str(len(request.body))
    head = f"{request.method} {request.path} HTTP/1.1\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return (head + "\r\n").encode("latin-1") + (request.body or b"")


async def read_response(reader: asyncio.StreamReader, method: str) -> tuple[int, bool]:
    """Read one response; its status and whether the connection can carry another."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise ResponseError("response head too long") from None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ResponseError(f"bad status line {lines[0][:80]!r}")
    status = int(parts[1])
    headers = {name.strip().lower(): value.strip()
               for name, _, value in (line.partition(":") for line in lines[1:] if line)}
    keep_alive = headers.get("connection", "").lower() != "close"
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return status, keep_alive
    if headers.get("transfer-encoding", "").lower() == "chunked":
        await _skip_chunks(reader)
    elif "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    else:  # the body runs until the server closes
        await reader.read()
        keep_alive = False
    return status, keep_alive


async def _skip_chunks(reader: asyncio.StreamReader) -> None:
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b""):  # trailers
                pass
            return
        await reader.readexactly(size + 2)  # the chunk and its CRLF


class HeldRequests:
    """A context manager keeping ``count`` requests in flight against one target.

    Entering starts the connections in a background thread and returns once
    each has sent its first request and ``settle_s`` more seconds have passed
    (for the server to take them in); leaving stops them and fills ``stats``.
    With ``drain_s``, leaving first lets the requests in flight be answered,
    for up to that many seconds, sending none again.
    """

    def __init__(self, host: str, port: int, request: Request, count: int,
                 cafile: Path, expected_status: int = 200, *, settle_s: float = 0.0,
                 drain_s: float = 0.0) -> None:
        self._settle_s = settle_s
        self._drain_s = drain_s
        self._draining = False
        self._address = (host, port)
        self._wire = wire_bytes(request, host, port)
        self._method = request.method
        self._expected = expected_status
        self._context = ssl.create_default_context(cafile=str(cafile))
        self.stats = HoldStats(count=count)
        self._in_flight = 0
        self._started = 0
        self._ramped = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="held-requests", daemon=True)

    def __enter__(self) -> HeldRequests:
        self._thread.start()
        # On a timeout, measure anyway: the stats show how many never got going.
        self._ramped.wait(RAMP_TIMEOUT_S)
        if self._settle_s > 0:
            time.sleep(self._settle_s)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._loop and self._stop:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join()

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        tasks = [asyncio.create_task(self._connection()) for _ in range(self.stats.count)]
        if not tasks:
            self._ramped.set()
        await self._stop.wait()
        if self._drain_s > 0:
            # No request is sent again; wait for the open ones to be answered.
            self._draining = True
            deadline = time.monotonic() + self._drain_s
            while self._in_flight and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        # Counted before cancelling: cancelling ends the requests still open.
        self.stats.open_at_stop = self._in_flight
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _stopping(self) -> bool:
        # A call, not the attribute: the drain sets it while this task awaits.
        return self._draining

    async def _connection(self) -> None:
        """One held request, sent again as soon as it is answered, until cancelled."""
        stream: Stream | None = None
        try:
            while not self._stopping():
                reused = stream is not None
                stream = stream or await self._connect()
                if self._stopping():  # the drain may have begun while connecting
                    break
                if not await self._exchange(*stream, reused=reused):
                    _close(stream)
                    stream = None
        finally:
            _close(stream)

    async def _connect(self) -> Stream:
        """A new connection, retried with a pause until it opens."""
        while True:
            try:
                return await asyncio.open_connection(
                    *self._address, ssl=self._context, server_hostname=self._address[0])
            except (OSError, ssl.SSLError) as error:
                self._error(error)
                await asyncio.sleep(RETRY_PAUSE_S)

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        *, reused: bool) -> bool:
        """Send the request once and count its answer; whether the connection lives on."""
        sent_at = time.monotonic()
        self._in_flight += 1
        self.stats.sent += 1
        self._note_started()
        try:
            writer.write(self._wire)
            await writer.drain()
            status, keep_alive = await read_response(reader, self._method)
        except asyncio.IncompleteReadError as error:
            if reused and not error.partial:
                # The server closed an idle kept-alive connection just as this
                # request went out: not a failure, send it again on a new one.
                self.stats.sent -= 1
            else:
                self._error(error)
            return False
        except (OSError, ssl.SSLError, ResponseError, ValueError) as error:
            self._error(error)
            await asyncio.sleep(RETRY_PAUSE_S)
            return False
        finally:
            self._in_flight -= 1
        self._record(status, time.monotonic() - sent_at)
        return keep_alive

    def _note_started(self) -> None:
        if self._started < self.stats.count:
            self._started += 1
            if self._started == self.stats.count:
                self._ramped.set()

    def _record(self, status: int, elapsed: float) -> None:
        if status == self._expected:
            self.stats.answered += 1
        else:
            self.stats.unexpected[status] += 1
        self.stats.total_answer_s += elapsed
        self.stats.slowest_answer_s = max(self.stats.slowest_answer_s, elapsed)

    def _error(self, error: BaseException) -> None:
        kind = {
            ConnectionRefusedError: "connect refused",
            ConnectionResetError: "reset",
            BrokenPipeError: "broken pipe",
            asyncio.IncompleteReadError: "closed mid-answer",
            ResponseError: "bad answer",
        }.get(type(error), type(error).__name__)
        self.stats.errors[kind] += 1


def _close(stream: Stream | None) -> None:
    """Drop a connection without waiting for the TLS goodbye: it is only ever abandoned."""
    if stream is not None:
        with contextlib.suppress(Exception):
            stream[1].transport.abort()


def combine(rounds: list[HoldStats]) -> HoldStats:
    """The stats of several rounds against one target, added up."""
    total = HoldStats(count=max((stats.count for stats in rounds), default=0))
    for stats in rounds:
        total.sent += stats.sent
        total.answered += stats.answered
        total.unexpected += stats.unexpected
        total.errors += stats.errors
        total.open_at_stop += stats.open_at_stop
        total.total_answer_s += stats.total_answer_s
        total.slowest_answer_s = max(total.slowest_answer_s, stats.slowest_answer_s)
    return total
