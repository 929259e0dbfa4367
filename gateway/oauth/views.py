"""The connection routes: the connect button, and the provider's return.

``POST /e/<id>/connect`` sits behind the same subject check as the
elicitation page. ``GET /oauth/callback`` is the one redirect URI every
provider knows; it checks the state, the browser and the user again before
anything is exchanged or stored.
"""

from __future__ import annotations

import logging

from flask import Blueprint, current_app, redirect, request
from werkzeug.wrappers import Response

from gateway import db
from gateway.credentials.catalog import CredentialType
from gateway.credentials.models import Credential
from gateway.elicitations import lifecycle
from gateway.elicitations.lifecycle import TERMINAL, Status
from gateway.elicitations.models import Elicitation
from gateway.elicitations.views import Page, ended, open_for, render, store
from gateway.errors import GatewayError
from gateway.identity.sessions import Subject
from gateway.identity.web import actor_of, browser_binding, current_subject, signed_in
from gateway.metrics import counters
from gateway.oauth import pages, service, states, tokens
from gateway.oauth.provider import GrantRefused, ProviderUnavailable, provider_for
from gateway.oauth.states import CallbackRefused
from gateway.vault.keyring import current_keyring
from gateway.web.context import current_clock, current_settings

log = logging.getLogger(__name__)
blueprint = Blueprint("oauth", __name__)


@blueprint.post("/e/<id:elicitation_id>/connect")
@signed_in(back="/e/{elicitation_id}")
def connect(elicitation_id: str, subject: Subject) -> Page | Response:
    """Send the user's browser to the provider, with a state bound to this browser: 303."""
    settings = current_settings()
    browser = browser_binding(settings.token_pepper)
    if browser is None:  # a signed-in user always has a stored session
        raise GatewayError("Your session could not be found. Reload the page.")
    with db.transaction() as session:
        elicitation = open_for(session, subject, elicitation_id)
    if elicitation.status in TERMINAL:
        return ended(elicitation)
    provider = provider_for(pages.connection_type(elicitation))
    # Discovered outside the transaction: the provider may take a moment.
    provider.endpoints()
    with db.transaction() as session:
        # Checked again: the link may have ended while the provider answered.
        elicitation = open_for(session, subject, elicitation_id)
        if elicitation.status in TERMINAL:
            return ended(elicitation)
        target = service.begin(session, current_clock(), settings.token_pepper, provider,
                               elicitation, browser, actor=actor_of(subject),
                               source_ip=request.remote_addr)
    return redirect(target, code=303)


@blueprint.get("/oauth/callback")
def callback() -> Page:
    """The provider's return: check state, browser and user; exchange; store; complete."""
    subject = current_subject()
    state = request.args.get("state", "")
    pepper = current_settings().token_pepper
    if subject is None:
        _refuse("no-session")
        raise CallbackRefused("This answer from the provider reached a browser that is not "
                              "signed in here. Open the app's link again in the browser "
                              "where you started.")
    with db.transaction() as session:
        claimed = states.claim(session, current_clock(), pepper, state,
                                browser_binding(pepper))
        # The check at finish: the user of this browser is still the one the
        # link was made for.
        elicitation = open_for(session, subject, claimed.id)
    if elicitation.status in TERMINAL:
        return ended(elicitation)
    credential_type = pages.connection_type(elicitation)
    error = request.args.get("error")
    if error is not None:
        return _provider_said_no(elicitation, subject, credential_type, error[:64])
    code = request.args.get("code", "")
    if not code:
        return _try_again(elicitation, subject, "The provider sent no authorization code.")
    try:
        credential = _exchange(elicitation, credential_type, code, state)
    except (GrantRefused, ProviderUnavailable) as failure:
        return _try_again(elicitation, subject, f"{failure.detail} Nothing was stored.")
    return _store(elicitation.id, subject, credential_type, credential)


def _exchange(elicitation: Elicitation, credential_type: CredentialType, code: str,
              state: str) -> Credential:
    """Trade the code for tokens, name the account, and seal it all; nothing stored yet."""
    provider = provider_for(credential_type)
    secret = states.derived(current_settings().token_pepper, state)
    answer = provider.exchange(code, secret.verifier)
    asked = tuple(elicitation.scopes or ())
    claims = service.claims_of(provider, answer, asked, secret.nonce, current_clock())
    assert credential_type.oauth is not None
    return tokens.seal_connection(
        current_keyring(), elicitation, credential_type, answer,
        scopes=tokens.granted_scopes(answer, asked),
        account=tokens.account_name(claims, credential_type.oauth.account_fields),
        now=current_clock().now())


def _store(elicitation_id: str, subject: Subject, credential_type: CredentialType,
           credential: Credential) -> Page:
    """Store the connection and complete the elicitation, in one transaction."""
    elicitation = store(elicitation_id, subject, credential)
    if elicitation.status != Status.COMPLETED:
        return ended(elicitation)
    return pages.connected_page(elicitation, credential_type, credential)


def _provider_said_no(elicitation: Elicitation, subject: Subject,
                      credential_type: CredentialType, error: str) -> Page:
    """``access_denied`` declines the request; any other error leaves the link open."""
    if error != "access_denied":
        host = credential_type.oauth.host if credential_type.oauth else "The provider"
        return _try_again(elicitation, subject, f"{host} did not connect your account: "
                          f"{service.provider_error_text(error)}.")
    with db.transaction() as session:
        current = open_for(session, subject, elicitation.id)
        if current.status not in TERMINAL:
            lifecycle.transition(session, current_clock(), current, Status.DECLINED,
                                 actor=actor_of(subject), source_ip=request.remote_addr,
                                 details={"provider_error": error})
    return ended(current)


def _try_again(elicitation: Elicitation, subject: Subject, error: str) -> tuple[str, int]:
    """The connect page again, saying what went wrong; the link stays open."""
    return render(db.session(), elicitation, subject, error=error), 400


def _refuse(reason: str) -> None:
    """Count a return that reached no signed-in browser: it stores and completes nothing.

    Counted and logged, not audited: anyone can send such a request, and an
    append-only record for each would let them fill the audit trail.
    """
    counters.of(current_app).oauth_callbacks_refused.labels(reason).inc()
    log.info("OAuth callback refused (%s) from %s", reason, request.remote_addr)
