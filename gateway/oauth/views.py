"""The connection routes: the connect button, and the provider's return.

``POST /e/<id>/connect`` sits behind the same subject check as the
elicitation page. ``GET /oauth/callback/<type id>`` is each type's own
redirect URI; it checks the state, the browser, the user, that the state
was issued for this type, and the provider's ``iss``, before anything is
exchanged or stored.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint, current_app, redirect, request
from werkzeug.wrappers import Response

from gateway import db
from gateway.audit import service as audit
from gateway.credentials.catalog import CredentialType
from gateway.credentials.models import Credential
from gateway.elicitations import lifecycle
from gateway.elicitations.lifecycle import TERMINAL, Status
from gateway.elicitations.models import Elicitation
from gateway.elicitations.views import Page, ended, open_for, render, store
from gateway.errors import GatewayError, NotFound
from gateway.identity.sessions import Subject
from gateway.identity.web import actor_of, browser_binding, current_subject, signed_in
from gateway.metrics import counters
from gateway.oauth import pages, service, states, tokens
from gateway.oauth.provider import (
    CALLBACK_PATH,
    ClientRefused,
    Endpoints,
    GrantRefused,
    Provider,
    ProviderUnavailable,
    provider_for,
    provider_of,
)
from gateway.oauth.refresh import CLIENT_REFUSED
from gateway.oauth.revocation import revoke_tokens
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


class RedirectURIChanged(GatewayError):
    """A return to the redirect URI every provider shared before each type had its own."""

    status = 410
    code = "redirect-uri-changed"
    title = "This address no longer takes answers from providers"


@blueprint.get(CALLBACK_PATH)
def old_callback() -> Page:
    """The old shared redirect URI: it reads no state and exchanges no code.

    A clear page rather than a bare 404: a user whose connection began before
    the change lands here and needs to know what to do, and an operator who
    has not registered the new URIs needs to learn it.
    """
    log.warning("a provider returned to the old shared redirect URI %s; each type's is now "
                "%s/<type id> (gateway status lists them)", CALLBACK_PATH, CALLBACK_PATH)
    raise RedirectURIChanged(
        "Nothing was stored. Each kind of account now returns to its own address here: go "
        "back to the app and open its link again. If you are sent here again, the gateway's "
        "operator must register the new redirect URI with the provider.")


@blueprint.get(f"{CALLBACK_PATH}/<type_id>")
def callback(type_id: str) -> Page:
    """A provider's return to one type's redirect URI: check state, browser, user and issuer;
    exchange; store; complete."""
    subject = current_subject()
    state = request.args.get("state", "")
    pepper = current_settings().token_pepper
    if subject is None:
        _refuse("no-session")
        raise CallbackRefused("This answer from the provider reached a browser that is not "
                              "signed in here. Open the app's link again in the browser "
                              "where you started.")
    provider = provider_of(type_id)
    if provider is None:
        raise NotFound("No kind of account is connected at this address.")
    # Discovered before the transaction (the provider may take a moment): the
    # issuer that an ``iss`` must name.
    elicitation = _claimed(subject, type_id, provider.endpoints(), state)
    if elicitation.status in TERMINAL:
        return ended(elicitation)
    credential_type = pages.connection_type(elicitation)
    error = request.args.get("error")
    if error is not None:
        return _provider_said_no(elicitation, subject, credential_type, error[:64])
    code = request.args.get("code", "")
    if not code:
        return _try_again(elicitation, subject, "The provider sent no authorization code.")
    secret = states.derived(pepper, state)
    try:
        answer = provider.exchange(code, secret.verifier)
    except (GrantRefused, ProviderUnavailable) as failure:
        if isinstance(failure, ClientRefused):
            _client_refused(elicitation, subject, type_id)
        return _try_again(elicitation, subject, f"{failure.detail} Nothing was stored.")
    return _finish(elicitation, subject, credential_type, provider, answer, secret.nonce)


def _claimed(subject: Subject, type_id: str, endpoints: Endpoints, state: str) -> Elicitation:
    """Use up the state for this browser and user; refuse (audited) a mix-up."""
    pepper = current_settings().token_pepper
    with db.transaction() as session:
        claimed = states.claim(session, current_clock(), pepper, state,
                               browser_binding(pepper))
        # The check at finish: the user of this browser is still the one the
        # link was made for.
        elicitation = open_for(session, subject, claimed.id)
        mix_up = service.mix_up(elicitation, type_id, endpoints, request.args.get("iss"))
        if mix_up is not None:
            audit.record(session, current_clock(), actor=actor_of(subject),
                         action="oauth.callback_refused", outcome="denied",
                         target=elicitation.id, source_ip=request.remote_addr,
                         details=mix_up.details)
    if mix_up is not None:
        log.warning("%s: a return refused as a mix-up: %s", type_id, mix_up.details["reason"])
        raise CallbackRefused(mix_up.text)
    return elicitation


def _finish(elicitation: Elicitation, subject: Subject, credential_type: CredentialType,
            provider: Provider, answer: dict[str, Any], nonce: str) -> Page:
    """Check and store a token answer, completing the link; revoke what is not stored."""
    try:
        credential = _sealed(elicitation, credential_type, provider, answer, nonce)
    except (GrantRefused, ProviderUnavailable) as failure:
        _discard(provider, answer, elicitation, subject, "refused")
        return _try_again(elicitation, subject, f"{failure.detail} Nothing was stored.")
    stored = store(elicitation.id, subject, credential)
    if stored.status != Status.COMPLETED:
        # The link ended (expired, cancelled) while the provider answered:
        # tokens nobody will ever reveal must not stay valid at the provider.
        _discard(provider, answer, stored, subject, "link-ended")
        return ended(stored)
    if db.session().get(Credential, credential.id) is None:
        # Another return (another tab) completed the link first. Its tokens
        # come from the same grant at the provider, which many providers
        # revoke as a whole: revoking these would end the connection just
        # stored. They are dropped here, never stored or shown.
        _discard(provider, answer, stored, subject, "completed-by-another-return",
                 revoke=False)
        return ended(stored)
    return pages.connected_page(stored, credential_type, credential)


def _sealed(elicitation: Elicitation, credential_type: CredentialType, provider: Provider,
            answer: dict[str, Any], nonce: str) -> Credential:
    """Check the token answer, name the account, and seal it all; nothing stored yet."""
    asked = tuple(elicitation.scopes or ())
    claims = service.claims_of(provider, answer, asked, nonce, current_clock())
    assert credential_type.oauth is not None
    return tokens.seal_connection(
        current_keyring(), elicitation, credential_type, answer,
        scopes=tokens.granted_scopes(answer, asked),
        account=tokens.account_name(claims, credential_type.oauth.account_fields),
        now=current_clock().now())


def _discard(provider: Provider, answer: dict[str, Any], elicitation: Elicitation,
             subject: Subject, reason: str, *, revoke: bool = True) -> None:
    """Revoke at the provider the tokens of an answer that is not stored, and audit it."""
    outcome = revoke_tokens(provider, tokens.token_set_of(answer)) if revoke else \
        "not revoked: the stored connection may share their grant"
    with db.transaction() as session:
        audit.record(session, current_clock(), actor=actor_of(subject),
                     action="oauth.tokens_discarded", target=elicitation.id,
                     source_ip=request.remote_addr,
                     details={"reason": reason, "provider_revocation": outcome})


def _client_refused(elicitation: Elicitation, subject: Subject, type_id: str) -> None:
    """Record that the provider refused the gateway's own client, for ``gateway status``.

    The operator's to fix (a wrong or rotated client secret), and the same
    record a refused refresh leaves, so status shows it whichever came first.
    """
    with db.transaction() as session:
        audit.record(session, current_clock(), actor=actor_of(subject), action=CLIENT_REFUSED,
                     target=type_id, source_ip=request.remote_addr, outcome="failure",
                     details={"elicitation_id": elicitation.id,
                              "provider_error": "invalid_client"})


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
