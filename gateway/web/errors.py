"""Errors: domain errors and HTTP errors become problem+json under /api/ and
a plain HTML page elsewhere. A 500 shows no stack trace and no internal detail.

A database the gateway cannot use at the moment answers 503 with
Retry-After instead: the request was sound, and the caller may send it again.
"""

from __future__ import annotations

import logging
import random
from typing import Any

from flask import Flask, Response, g, jsonify, render_template, request
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from werkzeug.exceptions import HTTPException

from gateway.errors import GatewayError

log = logging.getLogger(__name__)

PROBLEM_TYPE_PREFIX = "urn:gateway:problem:"
API_PREFIX = "/api/"
_STANDARD_MEMBERS = frozenset({"type", "title", "status", "detail", "instance", "request_id"})
# The database refused or dropped the connection (a restart, PostgreSQL's
# "too many clients"), no pooled connection came free in time, or SQLite
# could not open or lock its file: nothing a caller did wrong, and over soon.
DATABASE_UNAVAILABLE = (OperationalError, PoolTimeout)
# Seconds a caller is asked to wait before sending the request again.
DATABASE_RETRY_AFTER_S = 5


def is_api_request() -> bool:
    """Whether the current request is under the JSON API."""
    return request.path.startswith(API_PREFIX)


class HttpsRequired(GatewayError):
    status = 403
    code = "https-required"
    title = "HTTPS required"

    def __init__(self) -> None:
        super().__init__(
            "This API is served over HTTPS only; the request came over plain HTTP and was "
            "not processed. Send it to the https:// URL. If it carried a token, that token "
            "crossed the network in the clear: rotate it."
        )


def init_app(app: Flask) -> None:
    """Give every request an id and register the error handlers."""
    app.before_request(_assign_request_id)
    app.after_request(_echo_request_id)
    app.register_error_handler(GatewayError, render_error)
    app.register_error_handler(HTTPException, _handle_http_error)
    for unavailable in DATABASE_UNAVAILABLE:
        app.register_error_handler(unavailable, _handle_database_unavailable)
    app.register_error_handler(Exception, _handle_unexpected)
    # Its handler answers a database that is away in one line; raised while
    # the request is set up (its session read), it would also reach Flask's
    # own error log with a traceback, once per request while it is away.
    app.logger.addFilter(_not_database_unavailable)


def _not_database_unavailable(record: logging.LogRecord) -> bool:
    return not (record.exc_info and isinstance(record.exc_info[1], DATABASE_UNAVAILABLE))


def problem(
    status: int, code: str, title: str, detail: str, extra: dict[str, Any] | None = None
) -> Response:
    """An RFC 9457 problem response."""
    body = {
        "type": PROBLEM_TYPE_PREFIX + code,
        "title": title,
        "status": status,
        "detail": detail,
        # Extension members never replace the standard ones.
        **{k: v for k, v in (extra or {}).items() if k not in _STANDARD_MEMBERS},
    }
    if "request_id" in g:
        body["request_id"] = g.request_id
    response = jsonify(body)
    response.status_code = status
    response.mimetype = "application/problem+json"
    return response


def _render(status: int, code: str, title: str, detail: str,
            extra: dict[str, Any] | None = None) -> Response:
    if is_api_request():
        return problem(status, code, title, detail, extra)
    html = render_template("error.html", status=status, title=title, detail=detail,
                           request_id=g.get("request_id"))
    return Response(html, status=status, mimetype="text/html")


def _assign_request_id() -> None:
    # An id to find a request's lines by, not a secret: the process's seeded
    # generator (reseeded in each forked worker) needs no system call.
    g.request_id = f"{random.getrandbits(64):016x}"


def _echo_request_id(response: Response) -> Response:
    if "request_id" in g:
        response.headers["X-Request-Id"] = g.request_id
    return response


def render_error(error: GatewayError) -> Response:
    """The answer to a domain error, with the headers it asks for."""
    response = _render(error.status, error.code, error.title, error.detail, error.extra)
    response.headers.update(error.headers())
    return response


def _handle_http_error(error: HTTPException) -> Response:
    # An error raised while the request's context was being set up (the
    # session, read from the database) reaches Flask's handlers as a 500
    # wrapping it, not as itself.
    original = getattr(error, "original_exception", None)
    if isinstance(original, DATABASE_UNAVAILABLE):
        return _handle_database_unavailable(original)
    status = error.code or 500
    title = error.name
    code = title.lower().replace(" ", "-")
    response = _render(status, code, title, error.description or title)
    for name, value in error.get_headers():
        if name.lower() not in ("content-type", "content-length"):
            response.headers[name] = value
    return response


def _handle_database_unavailable(error: Exception) -> Response:
    # One line, not a traceback per request: while the database is away,
    # every request fails the same way. The driver's first line says why.
    log.warning("database unavailable on %s %s: %s", request.method, request.path,
                str(error).partition("\n")[0])
    response = _render(503, "database-unavailable", "Service temporarily unavailable",
                       "The gateway cannot use its database at the moment, so the request was "
                       f"not completed. Try again in {DATABASE_RETRY_AFTER_S} seconds.")
    response.headers["Retry-After"] = str(DATABASE_RETRY_AFTER_S)
    return response


def _handle_unexpected(error: Exception) -> Response:
    # The full story goes to the log, keyed by request id; the caller gets
    # nothing that could describe the inside of the gateway.
    log.exception("unhandled error on %s %s", request.method, request.path)
    return _render(500, "internal-error", "Internal server error",
                   "Something went wrong on our side. The request was not completed; "
                   "you can try again. Quote the request id if you report it.")
