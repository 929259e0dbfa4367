"""The landing page and the health probes."""

from __future__ import annotations

import logging
from datetime import timedelta

from flask import Blueprint, Response, current_app, jsonify, render_template
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from gateway import db, migrations
from gateway.clock import Clock
from gateway.settings import Settings
from gateway.web.https import allow_plain_http
from gateway.webhooks import service as webhooks

log = logging.getLogger(__name__)
blueprint = Blueprint("web", __name__)


@blueprint.get("/")
def index() -> str:
    """What this site is, for someone who arrives without a link."""
    return render_template("index.html")


@blueprint.get("/healthz")
@allow_plain_http  # load balancers probe backends directly; the answer holds nothing
def healthz() -> Response:
    """The process is alive and answering."""
    return jsonify(status="ok")


@blueprint.get("/readyz")
@allow_plain_http  # as /healthz
def readyz() -> tuple[Response, int]:
    """The database answers, its schema is the one this code expects, webhooks go out."""
    settings: Settings = current_app.extensions["gateway.settings"]
    clock: Clock = current_app.extensions["gateway.clock"]
    stalled: str | None = None
    try:
        with db.for_reads(db.engine()).connect() as connection:
            connection.execute(text("SELECT 1"))
        current = migrations.is_current(db.engine())
        if current:
            with db.for_reads(db.engine()).connect() as connection:
                stalled = webhooks.stalled(connection, clock.now(),
                                           timedelta(seconds=settings.webhook_lease_seconds))
    except SQLAlchemyError as error:
        log.warning("readiness: database unreachable: %s", type(error).__name__)
        return jsonify(status="unavailable", database="unreachable"), 503
    if not current:
        return jsonify(status="unavailable", database="ok", migrations="pending"), 503
    if stalled:
        log.warning("readiness: %s", stalled)
        return jsonify(status="unavailable", database="ok", migrations="current",
                       webhooks="stalled", reason=stalled), 503
    return jsonify(status="ready", database="ok", migrations="current"), 200
