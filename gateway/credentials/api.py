"""``/api/v1/credentials``: the owning client lists, reveals and revokes keys."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Final

from flask import Blueprint, Response, jsonify, request
from pydantic import TypeAdapter

from gateway import db
from gateway.credentials import service
from gateway.credentials.catalog import current_catalog
from gateway.elicitations.schemas import Issuer, SubjectId
from gateway.errors import InvalidInput
from gateway.oauth import refresh, revocation
from gateway.oauth.provider import provider_of
from gateway.vault.keyring import current_keyring
from gateway.web.api import current_client, query_cursor, query_text
from gateway.web.context import current_clock, current_settings

blueprint = Blueprint("credentials", __name__, url_prefix="/credentials")

MAX_PAGE: Final = 100
_WHOLE_NUMBER = re.compile(r"[0-9]{1,4}")


ISSUER: Final = TypeAdapter[str](Issuer)
SUBJECT_ID: Final = TypeAdapter[str](SubjectId)


def _type() -> str | None:
    value = request.args.get("type")
    if value is not None and value not in current_catalog():
        raise InvalidInput(f"type must be one of {', '.join(current_catalog().ids)}",
                           field="type")
    return value


def _actor() -> str:
    return f"client:{current_client().id}"


@blueprint.get("")
def list_credentials() -> Response:
    """Metadata of the client's credentials, newest first; never a secret."""
    raw_limit = request.args.get("limit", "50")
    if not _WHOLE_NUMBER.fullmatch(raw_limit) or not 1 <= int(raw_limit) <= MAX_PAGE:
        raise InvalidInput(f"limit is a whole number from 1 to {MAX_PAGE}", field="limit")
    status = request.args.get("status", "active")
    if status not in ("active", "all"):
        raise InvalidInput("status is active or all", field="status")
    page, next_cursor = service.list_for_client(
        db.session(), current_client().id, subject_iss=query_text("subject_iss", ISSUER),
        subject_sub=query_text("subject_sub", SUBJECT_ID), type_id=_type(),
        include_revoked=status == "all", cursor=query_cursor(),
        limit=int(raw_limit))
    items = [service.represent(credential) for credential in page]
    return jsonify(items=items, next_cursor=next_cursor)


@blueprint.post("/<id:credential_id>/reveal")
def reveal(credential_id: str) -> Response:
    """The plaintext key, or a connection's working access token; audited, never cached."""
    ask = _reveal(credential_id)
    # Handed out only once the transaction with its audit row has committed.
    with db.transaction() as session:
        key = service.reveal_key(session.connection(), ask.clock, ask.keyring, ask.client_id,
                                 credential_id, actor=ask.actor, source_ip=ask.source_ip)
        if key is None:  # an OAuth connection
            credential = service.get_for_client(session, ask.client_id, credential_id)
            provider = provider_of(credential.type)
            revealed = refresh.reveal_if_fresh(session, ask, credential,
                                               refreshable=provider is not None)
    if key is not None:
        return jsonify(id=key.id, type=key.type, secret=key.secret)
    if revealed is None:  # due: refreshed outside the transaction, once for everyone
        revealed = refresh.refresh_then_reveal(ask, provider, credential)
    return jsonify(revealed.as_json())


def _reveal(credential_id: str) -> refresh.Reveal:
    return refresh.Reveal(
        client_id=current_client().id, credential_id=credential_id, actor=_actor(),
        source_ip=request.remote_addr, clock=current_clock(), keyring=current_keyring(),
        margin=timedelta(seconds=current_settings().oauth_refresh_margin_seconds))


@blueprint.delete("/<id:credential_id>")
def revoke(credential_id: str) -> Response:
    """Revoke a credential (a connection at its provider too); it can no longer be revealed."""
    client_id = current_client().id
    credential, _ = revocation.revoke(
        db.transaction, lambda session: service.get_for_client(session, client_id, credential_id),
        revocation.AtProvider(current_keyring, provider_of), clock=current_clock(),
        actor=_actor(), source_ip=request.remote_addr, reason=service.Reason.CLIENT)
    return jsonify(service.represent(credential))
