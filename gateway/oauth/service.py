"""The two legs of a connection: sending the browser to the provider, and its return.

The ``state`` handed to the provider carries 256 random bits. Only its keyed
digest is stored, bound to the elicitation and to the browser session that
pressed "Connect", expiring with the link and used at most once. The PKCE
verifier and the OpenID Connect nonce are derived from the state under the
same key: they are never stored, and nobody without the key and the state
can compute them.

The return is checked in this order: a state we issued, not used, not
expired, sent back to the browser it was issued to, whose user is still
the elicitation's (the check at finish). Only then is the code exchanged,
and the tokens are stored in the one transaction that completes the
elicitation (:func:`gateway.credentials.service.capture`).
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from typing import Any, Final, cast

from sqlalchemy import CursorResult, delete, update
from sqlalchemy.orm import Session

from gateway.audit import service as audit
from gateway.clock import Clock
from gateway.elicitations.models import Elicitation
from gateway.elicitations.service import WrongAccount
from gateway.errors import GatewayError
from gateway.oauth.models import OAuthState
from gateway.oauth.provider import Provider, ProviderUnavailable
from gateway.settings import Secret
from gateway.tokens import keyed_digest

STATE_BYTES: Final = 32

# What a provider's error code means for the user (RFC 6749 section 4.1.2.1).
# Anything else reads as the operator's problem: the provider and the
# gateway are not set up for each other.
PROVIDER_ERRORS: Final = {
    "invalid_scope": "it does not offer some of the permissions the app asked for",
    "server_error": "it had a problem of its own",
    "temporarily_unavailable": "it is busy just now",
}
MISCONFIGURED: Final = ("it is not set up to connect accounts for this gateway (its operator "
                        "must check the credential type)")


class CallbackRefused(GatewayError):
    """A return from the provider that this gateway cannot accept; nothing was stored."""

    status = 400
    code = "connection-refused"
    title = "This answer from the provider cannot be used"


@dataclass(frozen=True, slots=True)
class Derived:
    """What a state stands for, derived under the pepper: never stored."""

    verifier: str
    nonce: str


def derived(pepper: Secret, state: str) -> Derived:
    """The PKCE verifier (64 characters, RFC 7636's alphabet) and the nonce of ``state``."""
    return Derived(keyed_digest(pepper, f"pkce:{state}"),
                   keyed_digest(pepper, f"nonce:{state}")[:32])


def begin(session: Session, clock: Clock, pepper: Secret, provider: Provider,
          elicitation: Elicitation, browser: str, *, actor: str,
          source_ip: str | None) -> str:
    """Issue a state for this elicitation and browser; the provider's URL to send it to.

    In the caller's transaction: the state is usable once that commits.
    """
    state = secrets.token_urlsafe(STATE_BYTES)
    now = clock.now()
    session.add(OAuthState(digest=keyed_digest(pepper, state), elicitation_id=elicitation.id,
                           session_digest=browser, created_at=now,
                           expires_at=elicitation.expires_at, used_at=None))
    scopes = tuple(elicitation.scopes or ())
    audit.record(session, clock, actor=actor, action="oauth.authorize", target=elicitation.id,
                 source_ip=source_ip,
                 details={"client_id": elicitation.client_id,
                          "type": elicitation.credential_type, "scopes": list(scopes)})
    secret = derived(pepper, state)
    return provider.authorization_url(
        state=state, verifier=secret.verifier, scopes=scopes,
        nonce=secret.nonce if provider.is_openid(scopes) else None)


def claim(session: Session, clock: Clock, pepper: Secret, state: str,
          browser: str | None) -> Elicitation:
    """Use up ``state`` for this browser; the elicitation it was issued for.

    Raises :class:`CallbackRefused` for a state that is unknown, used or
    expired, and :class:`WrongAccount` for one issued to another browser
    (a provider URL forwarded to someone else), without using it up.
    """
    row = session.get(OAuthState, keyed_digest(pepper, state)) if state else None
    if row is None:
        raise CallbackRefused("This answer from the provider does not belong to a connection "
                              "started here. Go back to the app and open its link again.")
    elicitation = session.get(Elicitation, row.elicitation_id)
    assert elicitation is not None
    if browser is None or not hmac.compare_digest(row.session_digest, browser):
        raise WrongAccount(elicitation)
    now = clock.now()
    if row.expires_at <= now:
        raise CallbackRefused("This connection took too long and its link has expired. Go back "
                              "to the app and start again.")
    used = session.execute(
        update(OAuthState).where(OAuthState.digest == row.digest, OAuthState.used_at.is_(None))
        .values(used_at=now).returning(OAuthState.digest)).first()
    if used is None:
        raise CallbackRefused("This answer from the provider was used already. If your account "
                              "is not connected yet, open the app's link again.")
    return elicitation


def provider_error_text(error: str) -> str:
    """Why the provider did not connect the account, in plain words."""
    return PROVIDER_ERRORS.get(error, MISCONFIGURED)


def claims_of(provider: Provider, answer: dict[str, Any], scopes: tuple[str, ...],
              nonce: str, clock: Clock) -> dict[str, Any]:
    """Who the user is at the provider: userinfo, else a checked ID token, else nothing."""
    claims: dict[str, Any] = {}
    id_token = answer.get("id_token")
    if provider.is_openid(scopes) and isinstance(id_token, str):
        claims = provider.id_token_claims(id_token, nonce, clock.now())
    userinfo = provider.userinfo(answer["access_token"])
    # OpenID Connect Core 1.0, section 5.3.2: userinfo about another user
    # than the ID token's must not be used.
    if "sub" in claims and "sub" in userinfo and userinfo["sub"] != claims["sub"]:
        raise ProviderUnavailable("The provider's userinfo names another user than its ID "
                                  "token.")
    return {**claims, **userinfo}


def forget_expired_states(session: Session, clock: Clock) -> int:
    """Delete the states whose link has expired: no return can use them any more."""
    # A DELETE's result is a CursorResult, which counts its rows.
    gone = cast(CursorResult[Any], session.execute(
        delete(OAuthState).where(OAuthState.expires_at <= clock.now())))
    return gone.rowcount
