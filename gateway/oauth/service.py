"""The two legs of a connection: sending the browser to the provider, and its return.

Each ``state`` comes from the state store (:mod:`gateway.oauth.states`). The
return is checked in this order: a state we issued, not used, not expired,
sent back to the browser it was issued to, whose user is still the
elicitation's (the check at finish). Only then is the code exchanged, and
the tokens are stored in the one transaction that completes the elicitation
(:func:`gateway.credentials.service.capture`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy.orm import Session

from gateway.audit import service as audit
from gateway.clock import Clock
from gateway.elicitations.models import Elicitation
from gateway.oauth import states
from gateway.oauth.provider import Endpoints, Provider, ProviderUnavailable
from gateway.settings import Secret

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


def begin(session: Session, clock: Clock, pepper: Secret, provider: Provider,
          elicitation: Elicitation, browser: str, *, actor: str,
          source_ip: str | None) -> str:
    """Issue a state for this elicitation and browser; the provider's URL to send it to.

    In the caller's transaction: the state is usable once that commits.
    """
    state = states.issue(session, clock, pepper, elicitation, browser)
    scopes = tuple(elicitation.scopes or ())
    audit.record(session, clock, actor=actor, action="oauth.authorize", target=elicitation.id,
                 source_ip=source_ip,
                 details={"client_id": elicitation.client_id,
                          "type": elicitation.credential_type, "scopes": list(scopes)})
    secret = states.derived(pepper, state)
    return provider.authorization_url(
        state=state, verifier=secret.verifier, scopes=scopes,
        nonce=secret.nonce if provider.is_openid(scopes) else None)


def provider_error_text(error: str) -> str:
    """Why the provider did not connect the account, in plain words."""
    return PROVIDER_ERRORS.get(error, MISCONFIGURED)


@dataclass(frozen=True, slots=True)
class MixUp:
    """Why a return cannot be the answer of the provider its state was sent to."""

    text: str  # for the user
    details: dict[str, str]  # for the audit trail


ANOTHER_PROVIDER: Final = ("This answer came back from another provider than the one you were "
                           "sent to, so it was refused and nothing was stored. Go back to the "
                           "app and open its link again.")


def mix_up(elicitation: Elicitation, type_id: str, endpoints: Endpoints,
           iss: str | None) -> MixUp | None:
    """Whether a return to ``type_id``'s redirect URI is a mix-up (RFC 9700 section 4.4).

    The state must have been issued for that type: a hostile provider in the
    catalog that sends the user on to another provider would otherwise receive
    that provider's code with our PKCE verifier. And when the type has an
    issuer, ``iss`` must name it whenever it is sent, and must be sent when the
    provider's discovery document promises it (RFC 9207 section 2.4). A type
    without an issuer has nothing to hold ``iss`` to: its own redirect URI is
    then the whole defence, as RFC 9700 section 4.4.2 allows.
    """
    if elicitation.credential_type != type_id:
        return MixUp(ANOTHER_PROVIDER, {"reason": "redirect-uri-of-another-type",
                                        "type": type_id,
                                        "state_type": str(elicitation.credential_type)})
    if endpoints.issuer is None:
        return None
    if iss is None:
        if not endpoints.iss_parameter:
            return None
        return MixUp("This answer does not say which provider sent it, although its provider "
                     "always does, so it was refused and nothing was stored. Go back to the "
                     "app and open its link again.", {"reason": "issuer-missing", "type": type_id})
    if iss != endpoints.issuer:
        return MixUp(ANOTHER_PROVIDER, {"reason": "issuer-mismatch", "type": type_id,
                                        "iss": iss[:255]})
    return None


def claims_of(provider: Provider, answer: dict[str, Any], scopes: tuple[str, ...],
              nonce: str, clock: Clock) -> dict[str, Any]:
    """Who the user is at the provider: userinfo, else a checked ID token, else nothing."""
    claims: dict[str, Any] = {}
    id_token = answer.get("id_token")
    if provider.is_openid(scopes):
        # The ID token's nonce is what ties this answer to this browser's
        # request when a provider ignores PKCE (OpenID Connect Core 3.1.3.3):
        # an answer without one proves nothing of the kind.
        if not isinstance(id_token, str) or not id_token:
            raise ProviderUnavailable("The provider answered without the ID token an OpenID "
                                      "Connect sign-in must carry.")
        claims = provider.id_token_claims(id_token, nonce, clock.now())
    userinfo = provider.userinfo(answer["access_token"])
    # OpenID Connect Core 1.0, section 5.3.2: userinfo about another user
    # than the ID token's must not be used.
    if "sub" in claims and "sub" in userinfo and userinfo["sub"] != claims["sub"]:
        raise ProviderUnavailable("The provider's userinfo names another user than its ID "
                                  "token.")
    return {**claims, **userinfo}
