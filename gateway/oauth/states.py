"""The state store: each ``state`` handed to a provider, single use, for one browser.

A state carries 256 random bits. Only its keyed digest is stored, bound to
the elicitation and to the browser session that pressed "Connect", expiring
:data:`STATE_LIFETIME` after that press (or with the link, if sooner) and
used at most once. The PKCE verifier and the OpenID
Connect nonce are derived from the state under the same key: they are never
stored, and nobody without the key and the state can compute them.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, cast

from sqlalchemy import CursorResult, delete, update
from sqlalchemy.orm import Session

from gateway.clock import Clock
from gateway.elicitations.models import Elicitation
from gateway.elicitations.service import WrongAccount
from gateway.errors import GatewayError
from gateway.oauth.models import OAuthState
from gateway.settings import Secret
from gateway.tokens import keyed_digest

STATE_BYTES: Final = 32
# A sign-in at a provider takes minutes; a state that lived as long as its
# link (up to days) would leave a stolen provider URL usable for as long.
STATE_LIFETIME: Final = timedelta(minutes=15)


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


def issue(session: Session, clock: Clock, pepper: Secret, elicitation: Elicitation,
          browser: str) -> str:
    """A new state for this elicitation and browser, in the caller's transaction."""
    state = secrets.token_urlsafe(STATE_BYTES)
    now = clock.now()
    session.add(OAuthState(digest=keyed_digest(pepper, state), elicitation_id=elicitation.id,
                           session_digest=browser, created_at=now,
                           expires_at=min(now + STATE_LIFETIME, elicitation.expires_at),
                           used_at=None))
    return state


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
        raise CallbackRefused("This connection took too long and has expired. Go back to the "
                              "app and open its link again.")
    used = session.execute(
        update(OAuthState).where(OAuthState.digest == row.digest, OAuthState.used_at.is_(None))
        .values(used_at=now).returning(OAuthState.digest)).first()
    if used is None:
        raise CallbackRefused("This answer from the provider was used already. If your account "
                              "is not connected yet, open the app's link again.")
    return elicitation


def forget_expired(session: Session, clock: Clock) -> int:
    """Delete the expired states: no return can use them any more."""
    # A DELETE's result is a CursorResult, which counts its rows.
    gone = cast(CursorResult[Any], session.execute(
        delete(OAuthState).where(OAuthState.expires_at <= clock.now())))
    return gone.rowcount
