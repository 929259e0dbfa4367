"""Request bodies: one size limit, whether the body's length is announced or it is chunked.

Werkzeug refuses a body whose Content-Length is over ``MAX_CONTENT_LENGTH``
with 413. A chunked body has no length: the server ends its stream, and
Werkzeug reads it up to the limit and stops there without a word, so a view
would act on a body cut short. Reading a chunked body first, one byte past
the limit at most, gives it a length, which Werkzeug then judges like any
other.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import IO, TYPE_CHECKING

from flask import Flask
from werkzeug.http import parse_set_header

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment


def init_app(app: Flask) -> None:
    """Give chunked request bodies a length before the app reads them."""
    limit = app.config["MAX_CONTENT_LENGTH"]
    app.wsgi_app = ChunkedBodies(app.wsgi_app, limit)  # type: ignore[method-assign]


class ChunkedBodies:
    """WSGI middleware: a chunked body up to ``limit`` (+1) bytes becomes one with a length."""

    def __init__(self, app: WSGIApplication, limit: int) -> None:
        self.app = app
        self.limit = limit

    def __call__(self, environ: WSGIEnvironment,
                 start_response: StartResponse) -> Iterable[bytes]:
        encoding = environ.get("HTTP_TRANSFER_ENCODING")  # most requests have none
        # Only a server that ends the stream itself (gunicorn does) may be
        # read without a length; otherwise Werkzeug reads nothing at all.
        if encoding and "chunked" in parse_set_header(encoding) and \
                environ.get("wsgi.input_terminated"):
            body = _read_at_most(environ["wsgi.input"], self.limit + 1)
            environ["wsgi.input"] = io.BytesIO(body)
            # Past the limit, the length says so, and reading the body
            # answers 413 as it would for a Content-Length that large.
            environ["CONTENT_LENGTH"] = str(len(body))
            del environ["HTTP_TRANSFER_ENCODING"]
        return self.app(environ, start_response)


def _read_at_most(stream: IO[bytes], size: int) -> bytes:
    # A read may return less than asked before the end (Werkzeug's own
    # dechunking reads one chunk at a time).
    parts: list[bytes] = []
    left = size
    while left > 0:
        part = stream.read(left)
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)
