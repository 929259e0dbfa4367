"""``/account``: the signed-in user's stored keys, and revoking them."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, redirect, render_template, request
from sqlalchemy.orm import Session
from werkzeug.wrappers import Response

from gateway import db
from gateway.credentials import service
from gateway.credentials.catalog import CredentialType, current_catalog
from gateway.credentials.models import Credential
from gateway.errors import NotFound
from gateway.identity.sessions import Subject
from gateway.identity.web import actor_of, signed_in
from gateway.oauth import revocation
from gateway.oauth.provider import provider_of
from gateway.pagination import timestamp
from gateway.vault.keyring import current_keyring
from gateway.web.context import current_clock

blueprint = Blueprint("account", __name__)


@blueprint.get("/account")
@signed_in()
def account(subject: Subject) -> Response | str:
    """Every key and connected account this user stored here, by app, with dates."""
    catalog = current_catalog()
    stored = service.list_for_subject(db.session(), subject.iss, subject.sub)
    rows = [_row(credential, client_name, catalog.get(credential.type))
            for credential, client_name in stored]
    return render_template("account.html", subject=subject,
                           credentials=[row for row in rows if row["kind"] == "api_key"],
                           connections=[row for row in rows if row["kind"] == "oauth"],
                           revoked=request.args.get("revoked"))


def _row(credential: Credential, client_name: str,
         credential_type: CredentialType | None) -> dict[str, Any]:
    return {"id": credential.id, "hint": credential.hint, "kind": credential.kind,
            "type": _label(credential_type, credential.type), "client": client_name,
            "created": f"{credential.created_at:%Y-%m-%d}",
            "created_iso": timestamp(credential.created_at),
            "account": credential.account, "scopes": credential.scopes or [],
            "refreshed": f"{credential.refreshed_at:%Y-%m-%d %H:%M} UTC"
            if credential.refreshed_at else None,
            "refreshed_iso": timestamp(credential.refreshed_at)}


def _label(credential_type: CredentialType | None, type_id: str) -> str:
    return credential_type.label if credential_type else type_id


@blueprint.post("/account/credentials/<id:credential_id>/revoke")
@signed_in(back="/account")
def revoke(credential_id: str, subject: Subject) -> Response:
    """Revoke one of the user's own keys or connections; the app can no longer use it."""

    def own(session: Session) -> Credential:
        credential = session.get(Credential, credential_id)
        # Someone else's key is reported exactly like a missing one.
        if credential is None or (credential.subject_iss, credential.subject_sub) != (
                subject.iss, subject.sub):
            raise NotFound("There is no such key in your account.")
        return credential

    revocation.revoke(db.transaction, own, revocation.AtProvider(current_keyring, provider_of),
                      clock=current_clock(), actor=actor_of(subject),
                      source_ip=request.remote_addr, reason=service.Reason.USER)
    return redirect("/account?revoked=1", code=303)
