"""One logging setup for every process: ``gateway serve`` (app and gunicorn), the
worker, the demo and the CLI.

Every record goes to stderr, so a command's stdout holds only what it prints
on purpose. ``log_format = "text"`` writes a line a person reads; ``"json"``
one object per line for a collector. Either way a logged value cannot forge a
line: JSON escapes it, and the text form escapes every control character
(newlines included) and indents a traceback's lines under its record.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import sys
import threading
import time
import weakref
from datetime import UTC, datetime
from typing import Any, Final, TextIO

from flask import g, has_request_context

from gateway.settings import Settings

HANDLER_NAME: Final = "gateway"
# What every LogRecord carries; anything else on a record came from `extra=`.
_RECORD_ATTRIBUTES: Final = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
_OWN_FIELDS: Final = frozenset({"request_id"})
# Libraries whose info lines narrate routine work (alembic describes its
# migration context on every command that checks the schema; Flask-Limiter
# writes a line for every request it refuses, which the access log already
# shows): heard from at warning and above, everything at debug.
_CHATTY_LIBRARIES: Final = ("alembic", "flask-limiter")


def configure(settings: Settings, stream: TextIO | None = None) -> logging.Handler:
    """Send this process's records to stderr (or ``stream``) in the configured format.

    Replaces the handler an earlier call installed and leaves any other alone
    (a test's capture, for one).
    """
    handler = BackgroundStreamHandler(stream if stream is not None else sys.stderr)
    handler.name = HANDLER_NAME
    handler.setFormatter(JsonFormatter() if settings.log_format == "json" else TextFormatter())
    handler.addFilter(RequestId())
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.name == HANDLER_NAME]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(settings.log_level.upper())
    for name in _CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(
            logging.NOTSET if settings.log_level == "debug" else logging.WARNING)
    return handler


class BackgroundStreamHandler(logging.Handler):
    """Writes records to a stream from a thread of its own; the logging thread only formats.

    A ``StreamHandler`` holds its lock while it writes, and a write lets go
    of the interpreter lock; every request writes an access line, and a lock
    that many threads want is handed on only as fast as each gets the
    interpreter lock back. Measured on 4 December 2026 with the API reads of
    ``bench/`` and 500 long-polls held, 10-second rounds: with a lock taken
    around each line, 611/s and 606/s in two runs (their rounds a third
    apart), and in two more runs rounds of 1,012/s to 1,425/s and one of
    550/s; with the access log switched off, four rounds at 1,230/s to
    1,506/s; with this handler, four at 1,376/s to 1,702/s. Here the thread
    that logs formats its record and queues the line, taking no lock; the
    writer writes what has queued every few milliseconds, in one write.

    :meth:`flush` returns once every line queued before it is written, and
    logging's shutdown at exit flushes and closes every handler, so no line
    is lost when a process ends normally.
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream
        self._start()
        _RUNNING.add(self)

    def _start(self) -> None:
        """A new queue and writer: at first, and in a forked child (no thread survives a fork)."""
        self._queue: queue.SimpleQueue[str | threading.Event | None] = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write, name="log-writer", daemon=True)
        self._writer.start()

    def handle(self, record: logging.LogRecord) -> logging.LogRecord | bool:  # type: ignore[override]
        """Filter and emit without the handler's lock: formatting needs none, the queue is safe."""
        kept = self.filter(record)
        if kept:
            self.emit(kept if isinstance(kept, logging.LogRecord) else record)
        return kept

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:
            self.handleError(record)
            return
        self._queue.put(line)

    def flush(self) -> None:
        """Wait until every line queued so far is written (at most a few seconds)."""
        if self._writer.is_alive():
            written = threading.Event()
            self._queue.put(written)
            written.wait(_FLUSH_SECONDS)

    def close(self) -> None:
        if self._writer.is_alive():
            self._queue.put(None)
            self._writer.join(_FLUSH_SECONDS)
        _RUNNING.discard(self)
        super().close()

    def _write(self) -> None:
        while True:
            items = [self._queue.get()]
            # Under load, lines arrive by the hundred a second: one write for
            # those of a few milliseconds instead of one for each.
            time.sleep(_GATHER_SECONDS)
            while not self._queue.empty():
                items.append(self._queue.get())
            # A closed or broken stream: there is nowhere left to say so.
            with contextlib.suppress(OSError, ValueError):
                self.stream.write("".join(item for item in items if isinstance(item, str)))
                self.stream.flush()
            for item in items:
                if isinstance(item, threading.Event):
                    item.set()  # a flush waiting for the lines queued before it
            if None in items:
                return


_FLUSH_SECONDS: Final = 5.0
_GATHER_SECONDS: Final = 0.005
_RUNNING: weakref.WeakSet[BackgroundStreamHandler] = weakref.WeakSet()


def _restart_in_child() -> None:
    for handler in list(_RUNNING):
        handler._start()


os.register_at_fork(after_in_child=_restart_in_child)


class RequestId(logging.Filter):
    """Stamps a record made while serving a request with that request's id.

    The id is the one the response carries (``X-Request-Id`` and problem
    bodies), so an operator finds a user's report in the log.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None and has_request_context():
            request_id = g.get("request_id")
            if request_id is not None:
                record.request_id = request_id
        return True


def timestamp(record: logging.LogRecord) -> str:
    """When the record was made, in UTC, ISO 8601 to the millisecond."""
    moment = datetime.fromtimestamp(record.created, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a caller passed with ``extra=``."""
    return {key: value for key, value in vars(record).items()
            if key not in _RECORD_ATTRIBUTES and key not in _OWN_FIELDS}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (ASCII only, so no line separator slips in)."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "ts": timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            fields["request_id"] = request_id
        fields.update({k: v for k, v in extra_fields(record).items() if k not in fields})
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            fields["stack"] = self.formatStack(record.stack_info)
        return json.dumps(fields, ensure_ascii=True, separators=(",", ":"), default=str)


class TextFormatter(logging.Formatter):
    """``2026-05-01T12:00:00.000Z INFO logger: message request_id=…``, escaped."""

    def format(self, record: logging.LogRecord) -> str:
        line = (f"{timestamp(record)} {record.levelname} {record.name}: "
                f"{escape(record.getMessage())}")
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            line += f" request_id={escape(str(request_id))}"
        details = []
        if record.exc_info:
            details.append(self.formatException(record.exc_info))
        if record.stack_info:
            details.append(self.formatStack(record.stack_info))
        # A traceback stays readable on its own lines, each indented, so that
        # nothing in it (an exception's message) can pass for a record.
        for detail in details:
            line += "".join(f"\n    {escape(part)}" for part in detail.splitlines())
        return line


def escape(text: str) -> str:
    """``text`` with every non-printable character (newline, ESC, U+2028…) written as an escape."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
