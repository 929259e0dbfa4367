"""One logging setup for every process: ``gateway serve`` (app and gunicorn), the
worker, the demo and the CLI.

Every record goes to stderr, so a command's stdout holds only what it prints
on purpose. ``log_format = "text"`` writes a line a person reads; ``"json"``
one object per line for a collector. Either way a logged value cannot forge a
line: JSON escapes it, and the text form escapes every control character
(newlines included) and indents a traceback's lines under its record.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import queue
import sys
import threading
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
    handler = QueueingHandler(stream if stream is not None else sys.stderr)
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


class QueueingHandler(logging.handlers.QueueHandler):
    """Formats a record in the thread that logs it; a ``QueueListener``'s thread writes it.

    The line is formatted before it is queued (``prepare`` formats with this
    handler's formatter, traceback and ``extra=`` fields included), so the
    listener's handler writes each queued message as it is.

    :meth:`flush` returns once every line queued before it is written, and
    :meth:`close` stops the listener once it has written them all. logging's
    shutdown at exit flushes and closes every handler, so no line is lost
    when a process ends normally.
    """

    def __init__(self, stream: TextIO) -> None:
        self.writer = logging.StreamHandler(stream)
        self.writer.setFormatter(logging.Formatter("%(message)s"))
        # Not queue.Queue: its lock is held while Python code runs, so the
        # interpreter can switch threads while one holds it, and then every
        # thread that logs waits. A SimpleQueue takes no such lock.
        super().__init__(queue.SimpleQueue())
        self._writes_itself = False
        self.listener: Listener | None = self._listen()
        _RUNNING.add(self)

    def _listen(self) -> Listener:
        listener = Listener(self.queue, self.writer)
        listener.start()
        return listener

    def handle(self, record: logging.LogRecord) -> logging.LogRecord | bool:  # type: ignore[override]
        """Filter, format and queue the record without the handler's lock.

        Logging's handlers take a lock around each record, and every request
        writes an access line: a lock that hundreds of threads want is
        handed on only as fast as each gets the interpreter lock back.
        Formatting needs no lock and the queue takes none. The A/B that
        keeps this is in bench/HISTORY.md (6 December).
        """
        kept = self.filter(record)
        if kept:
            self.emit(kept if isinstance(kept, logging.LogRecord) else record)
        return kept

    def flush(self) -> None:
        """Return once every line queued so far is written."""
        if self.listener is not None:
            written = threading.Event()
            self.queue.put_nowait(written)
            written.wait()

    def close(self) -> None:
        self.acquire()  # configure() and logging's shutdown may both close it
        try:
            listener, self.listener = self.listener, None
        finally:
            self.release()
        if listener is not None:
            listener.stop()
        self.writer.close()
        _RUNNING.discard(self)
        super().close()

    def restart_in_child(self) -> None:
        # No thread survives a fork, and the parent's queue may hold lines the
        # parent will write. The child writes its own lines at once, in the
        # thread that logs them: a forked gunicorn worker runs one thread
        # (gevent's greenlets share it), so no other thread waits at the
        # handler, and a thread started before gevent patches the worker
        # would fail as it ends.
        if self.listener is not None:
            self.queue = queue.SimpleQueue()
            self.listener = None
            self._writes_itself = True

    def enqueue(self, record: logging.LogRecord) -> None:
        """Queue the formatted record for the listener (or, in a forked child, write it)."""
        if self._writes_itself:
            self.writer.handle(record)
        else:
            super().enqueue(record)


class Listener(logging.handlers.QueueListener):
    """A ``QueueListener`` that also sets each ``Event`` it finds in the queue: a flush.

    (A flush cannot stop the listener and start another: from Python 3.12 a
    process that has begun to exit may start no thread, and logging flushes
    every handler then.)
    """

    def handle(self, record: logging.LogRecord | threading.Event) -> None:
        if isinstance(record, threading.Event):
            record.set()
        else:
            super().handle(record)


_RUNNING: weakref.WeakSet[QueueingHandler] = weakref.WeakSet()


def _restart_in_child() -> None:
    for handler in list(_RUNNING):
        handler.restart_in_child()


# gunicorn configures logging in its master, then forks its workers.
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
