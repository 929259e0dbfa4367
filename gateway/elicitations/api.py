"""``/api/v1/elicitations``: create, read (with long-poll), list, cancel."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Final

from flask import Blueprint, Response, current_app, jsonify, request
from pydantic import TypeAdapter

from gateway import db
from gateway.credentials.catalog import current_catalog
from gateway.elicitations import lifecycle, service
from gateway.elicitations.lifecycle import TERMINAL, Status
from gateway.elicitations.models import Elicitation
from gateway.elicitations.schemas import Issuer, SubjectId, create_adapter
from gateway.elicitations.waiting import WaitHub
from gateway.errors import InvalidInput
from gateway.web.api import (
    current_client,
    joined_row,
    json_body,
    query_cursor,
    query_text,
    token_joined,
)
from gateway.web.context import current_clock, current_settings

blueprint = Blueprint("elicitations", __name__, url_prefix="/elicitations")

MAX_WAIT_SECONDS: Final = 60
DEFAULT_PAGE: Final = 50
_IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")
_WHOLE_NUMBER = re.compile(r"[0-9]{1,4}")
_STATUSES: Final = frozenset(s.value for s in Status)
_KINDS: Final = frozenset({"api_key", "oauth", "payment"})
_ISSUER: Final = TypeAdapter[str](Issuer)
_SUBJECT_ID: Final = TypeAdapter[str](SubjectId)


def _caller() -> service.Caller:
    return service.Caller(current_client(), request.remote_addr)


def _answer(elicitation: Elicitation, status: int = 200) -> tuple[Response, int]:
    now = current_clock().now()
    return jsonify(service.represent(elicitation, current_settings().public_url, now)), status


@blueprint.post("")
def create() -> tuple[Response, int]:
    """Create an elicitation for one of the client's users."""
    body = json_body(create_adapter)
    key = request.headers.get("Idempotency-Key")
    if key is not None and not _IDEMPOTENCY_KEY.fullmatch(key):
        raise InvalidInput("Idempotency-Key is 1 to 255 visible ASCII characters",
                           field="Idempotency-Key")
    settings = current_settings()

    def attempt() -> service.Outcome:
        with db.transaction() as session:
            return service.create(
                session, current_clock(), _caller(), body, catalog=current_catalog(),
                payments_enabled=settings.stripe_secret_key is not None,
                public_url=settings.public_url, idempotency_key=key,
                request_digest=service.request_digest(request.get_data(cache=True)))

    # Two requests with the same Idempotency-Key raced and the other
    # committed first: the second attempt replays its answer.
    outcome = db.retry_on_conflict(attempt, attempts=1 if key is None else 2)
    response = jsonify(outcome.body)
    if outcome.status_code == 201:
        response.headers["Location"] = f"{request.path}/{outcome.body['id']}"
    return response, outcome.status_code


@blueprint.get("/<id:elicitation_id>")
@token_joined(service.READ_WITH_TOKEN_CHECK)
def read(elicitation_id: str) -> tuple[Response, int]:
    """One elicitation; with ``?wait=N``, held until it ends or N seconds pass."""
    wait = _wait_seconds()
    elicitation = _current_state(elicitation_id, service.read_joined(joined_row(),
                                                                    elicitation_id))
    if wait and elicitation.status not in TERMINAL:
        _hold(elicitation, wait)
        elicitation = _current_state(elicitation_id)
    return _answer(elicitation)


def _current_state(elicitation_id: str, stored: Elicitation | None = None) -> Elicitation:
    # Most reads find the elicitation as stored, and change nothing. Only an
    # overdue one is marked expired, in a write transaction with its audit row.
    elicitation = stored or service.read(db.session().connection(), current_client(),
                                         elicitation_id)
    if lifecycle.is_overdue(elicitation, current_clock().now()):
        with db.transaction() as session:
            elicitation = service.get(session, current_client(), elicitation_id)
            service.expire_if_overdue(session, current_clock(), elicitation)
    return elicitation


def _hold(elicitation: Elicitation, wait: float) -> None:
    # The database connection goes back to the pool while the request waits.
    db.session().close()
    until_expiry = (elicitation.expires_at - current_clock().now()).total_seconds()
    hub: WaitHub = current_app.extensions["gateway.waits"]
    hub.wait(elicitation.id, min(wait, max(until_expiry, 0)), connection=_client_connection())


def _client_connection() -> int | None:
    # The socket gunicorn serves the request on (absent in tests' clients).
    sock = request.environ.get("gunicorn.socket")
    return sock.fileno() if sock is not None else None


def _wait_seconds() -> float:
    raw = request.args.get("wait")
    if raw is None:
        return 0
    if not _WHOLE_NUMBER.fullmatch(raw) or int(raw) > MAX_WAIT_SECONDS:
        raise InvalidInput(f"wait is a whole number of seconds from 0 to {MAX_WAIT_SECONDS}",
                           field="wait")
    return int(raw)


@blueprint.get("")
def list_elicitations() -> Response:
    """The client's elicitations, newest first, filtered and paged by cursor."""
    filters = service.Filters(
        status=_choice("status", _STATUSES), kind=_choice("kind", _KINDS),
        subject_iss=query_text("subject_iss", _ISSUER),
        subject_sub=query_text("subject_sub", _SUBJECT_ID))
    limit = _limit()
    with db.transaction() as session:
        page, next_cursor = service.list_page(session, current_clock(), current_client().id,
                                              filters, query_cursor(), limit)
        now: datetime = current_clock().now()
        items = [service.represent(e, current_settings().public_url, now) for e in page]
    return jsonify(items=items, next_cursor=next_cursor)


def _choice(name: str, allowed: frozenset[str]) -> str | None:
    value = request.args.get(name)
    if value is not None and value not in allowed:
        raise InvalidInput(f"{name} must be one of {', '.join(sorted(allowed))}", field=name)
    return value


def _limit() -> int:
    raw = request.args.get("limit", str(DEFAULT_PAGE))
    if not _WHOLE_NUMBER.fullmatch(raw) or not 1 <= int(raw) <= service.MAX_PAGE:
        raise InvalidInput(f"limit is a whole number from 1 to {service.MAX_PAGE}",
                           field="limit")
    return int(raw)


@blueprint.post("/<id:elicitation_id>/cancel")
def cancel(elicitation_id: str) -> tuple[Response, int]:
    """Cancel an open elicitation; its link stops working."""
    caller = _caller()
    with db.transaction() as session:
        elicitation = service.get(session, caller.client, elicitation_id)
        service.cancel(session, current_clock(), elicitation, actor=caller.actor,
                       source_ip=caller.source_ip)
    return _answer(elicitation)
