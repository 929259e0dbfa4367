"""OpenID Connect login: the gateway as a relying party of the MCP server's provider.

Authorization code flow with PKCE (S256); ``state``, ``nonce`` and the code
verifier live in the server-side session of the browser that started the
login, so a callback carried to another browser fails. The ID token is
checked one claim at a time: signature against the provider's JWKS, ``iss``
exactly the configured issuer, ``aud`` holding our client id (and ``azp``
when there are several), ``exp``/``iat``, and the ``nonce``. The subject is
``(iss, sub)`` from the token. Every call to the provider goes through the
SSRF-guarded HTTP client.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, NoReturn
from urllib.parse import urlencode

import requests
from authlib.common.security import generate_token
from authlib.integrations.base_client.errors import OAuthError
from authlib.integrations.requests_client import OAuth2Session
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from flask import current_app, redirect, request, session
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet
from sqlalchemy.orm import Session
from werkzeug.wrappers import Response

from gateway.audit import service as audit
from gateway.clock import Clock
from gateway.errors import GatewayError
from gateway.identity.sessions import Subject
from gateway.identity.web import actor_of
from gateway.outbound import BlockedDestination, OutboundPolicy, guard_session, guarded_session
from gateway.settings import Settings
from gateway.web.context import current_clock

log = logging.getLogger(__name__)

SESSION_KEY: Final = "oidc_login"
# A login started longer ago than this is refused at the callback.
LOGIN_WINDOW: Final = timedelta(minutes=10)
CLOCK_SKEW: Final = timedelta(seconds=60)
METADATA_TTL_SECONDS: Final = 3600
# Asymmetric algorithms only: "none" and HMAC (keyed with our own client
# secret) would let anyone who knows that secret mint tokens.
ALLOWED_ALGORITHMS: Final = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                             "ES256", "ES384", "ES512", "EdDSA")
EXTENSION: Final = "gateway.oidc"


class LoginError(GatewayError):
    """The login could not be completed; the page says what to do."""

    status = 400
    code = "login-failed"
    title = "Login failed"


class LoginRefused(LoginError):
    """A callback or an ID token that does not check out: audited (:func:`record_failure`)."""

    def __init__(self, message: str, *, reason: str,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(f"Login failed: {message}. Go back to the app and open its link again.")
        # For the audit row: why, in a word, and what the provider said.
        self.reason = reason
        self.details = details or {}


class ProviderUnavailable(GatewayError):
    status = 502
    code = "identity-provider-unavailable"
    title = "The identity provider did not answer"


def _refused(error: BlockedDestination) -> ProviderUnavailable:
    # A setting, not an outage: the operator configured an issuer the
    # outbound guard refuses (plain http, a private address). The log says
    # which; the user learns only that the operator must act.
    log.error("identity provider request refused by the outbound guard: %s", error)
    return ProviderUnavailable("the gateway may not connect to its identity provider as "
                               "configured; its operator must correct the issuer setting")


@dataclass(frozen=True, slots=True)
class Metadata:
    """What discovery told us about the provider."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str


class Provider:
    """The configured provider: discovery and keys, fetched once and cached."""

    def __init__(self, settings: Settings) -> None:
        # Settings validation requires all three when the backend is oidc.
        assert settings.oidc_issuer
        assert settings.oidc_client_id
        assert settings.oidc_client_secret
        # Compared exactly with discovery and every ID token: no normalising.
        self.issuer = settings.oidc_issuer
        self.client_id = settings.oidc_client_id
        self._client_secret = settings.oidc_client_secret
        self.redirect_uri = f"{settings.public_url}/login/callback"
        self._policy = OutboundPolicy.from_settings(settings)
        self._lock = threading.Lock()
        self._metadata: Metadata | None = None
        self._keys: KeySet | None = None
        self._fetched_at = 0.0

    def http(self) -> requests.Session:
        return guarded_session(self._policy)

    def metadata(self) -> Metadata:
        with self._lock:
            if self._metadata is None or time.monotonic() - self._fetched_at > \
                    METADATA_TTL_SECONDS:
                self._metadata = self._discover()
                self._keys = None
                self._fetched_at = time.monotonic()
            return self._metadata

    def keys(self, *, refresh: bool = False) -> KeySet:
        metadata = self.metadata()
        with self._lock:
            if self._keys is None or refresh:
                self._keys = KeySet.import_key_set(
                    self._get_json(metadata.jwks_uri))  # type: ignore[arg-type]
            return self._keys

    @property
    def discovery_url(self) -> str:
        return f"{self.issuer.rstrip('/')}/.well-known/openid-configuration"

    def probe(self, timeout: float) -> Metadata:
        """Fetch and check the discovery document once, now, uncached: a start-up check.

        Raises what the call raises: :class:`BlockedDestination` when the guard
        refuses the provider, requests' errors when it does not answer as
        asked, ``ValueError`` for an answer that is not JSON, and
        :class:`ProviderUnavailable` for a document that is not this issuer's.
        """
        with self.http() as http:
            response = http.get(self.discovery_url, headers={"Accept": "application/json"},
                                timeout=(timeout, timeout))
            response.raise_for_status()
            return self._metadata_from(response.json())

    def _discover(self) -> Metadata:
        return self._metadata_from(self._get_json(self.discovery_url))

    def _metadata_from(self, document: Any) -> Metadata:
        # OpenID Connect Discovery 1.0, section 4.3: the document must name
        # exactly the issuer we asked, or it may be someone else's.
        found = document.get("issuer") if isinstance(document, dict) else None
        if found != self.issuer:
            raise ProviderUnavailable(f"the identity provider's discovery document names the "
                                      f"issuer {found!r:.200}, not {self.issuer!r} "
                                      "(GATEWAY_OIDC_ISSUER)")
        try:
            return Metadata(document["issuer"], document["authorization_endpoint"],
                            document["token_endpoint"], document["jwks_uri"])
        except KeyError as missing:
            raise ProviderUnavailable(f"the discovery document lacks {missing}") from None

    def _get_json(self, url: str) -> dict[str, Any]:
        try:
            response = self.http().get(url, headers={"Accept": "application/json"})
            response.raise_for_status()
            document: dict[str, Any] = response.json()
        except BlockedDestination as error:
            raise _refused(error) from None
        except (requests.RequestException, ValueError) as error:
            log.warning("identity provider request failed: %s", type(error).__name__)
            raise ProviderUnavailable("the identity provider could not be reached; try again "
                                      "in a moment") from None
        return document

    def exchange(self, code: str, verifier: str) -> dict[str, Any]:
        """Trade the authorization code for tokens (client_secret_basic, with PKCE)."""
        client = OAuth2Session(self.client_id, self._client_secret.reveal(),
                               token_endpoint_auth_method="client_secret_basic")  # noqa: S106
        guard_session(client, self._policy)
        try:
            token: dict[str, Any] = client.fetch_token(
                self.metadata().token_endpoint, grant_type="authorization_code", code=code,
                redirect_uri=self.redirect_uri, code_verifier=verifier)
        except OAuthError as error:
            raise LoginError("the identity provider refused the login "
                             f"({error.error}); start again from the app") from None
        except BlockedDestination as error:
            raise _refused(error) from None
        except requests.RequestException as error:
            log.warning("token request failed: %s", type(error).__name__)
            raise ProviderUnavailable("the identity provider could not be reached; try again "
                                      "in a moment") from None
        finally:
            client.close()
        return token


def provider() -> Provider:
    """The provider of the current app."""
    found: Provider | None = current_app.extensions.get(EXTENSION)
    if found is None:
        found = Provider(current_app.extensions["gateway.settings"])
        current_app.extensions[EXTENSION] = found
    return found


# --- the two legs of a login ---------------------------------------------------------


def start_login(next_path: str) -> Response:
    """Remember state, nonce and verifier in this browser's session; off to the provider."""
    chosen = provider()
    state, nonce, verifier = generate_token(32), generate_token(32), generate_token(64)
    session[SESSION_KEY] = {"state": state, "nonce": nonce, "verifier": verifier,
                            "next": next_path, "started": current_clock().now().isoformat()}
    query = urlencode({
        "response_type": "code", "client_id": chosen.client_id,
        "redirect_uri": chosen.redirect_uri, "scope": "openid", "state": state,
        "nonce": nonce, "code_challenge": create_s256_code_challenge(verifier),
        "code_challenge_method": "S256",
    })
    return redirect(f"{chosen.metadata().authorization_endpoint}?{query}", code=303)


def finish_login() -> tuple[Subject, str]:
    """Check the callback and the ID token; the subject and where to go next.

    Writes nothing: the view records the login (:func:`record_login`), or
    the :class:`LoginRefused` this raises (:func:`record_failure`), in its
    transaction.
    """
    pending = session.pop(SESSION_KEY, None)
    if not isinstance(pending, dict):
        _fail("no login was started in this browser, or it was finished already",
              "no-pending-login")
    started = datetime.fromisoformat(pending["started"])
    if current_clock().now() - started > LOGIN_WINDOW:
        _fail("the login took too long", "login-window-passed")
    if not hmac.compare_digest(request.args.get("state", ""), pending["state"]):
        _fail("the login answer does not belong to this browser", "state-mismatch")
    if "error" in request.args:
        _fail("the identity provider did not log you in", "provider-error",
              detail={"error": request.args.get("error", "")[:100]})
    code = request.args.get("code")
    if not code:
        _fail("the identity provider sent no authorization code", "no-code")
    chosen = provider()
    token = chosen.exchange(code, pending["verifier"])
    claims = verify_id_token(chosen, token.get("id_token"), pending["nonce"])
    return Subject(claims["iss"], claims["sub"]), pending["next"]


def record_login(stored: Session, clock: Clock, subject: Subject, *,
                 source_ip: str | None) -> None:
    """The audit row of a login that :func:`finish_login` let through."""
    audit.record(stored, clock, actor=actor_of(subject), action="login", target=subject.sub,
                 source_ip=source_ip, details={"backend": "oidc"})


def record_failure(stored: Session, clock: Clock, error: LoginRefused, *,
                   source_ip: str | None) -> None:
    """The audit row of a login that :func:`finish_login` refused."""
    audit.record(stored, clock, actor=f"anonymous@{source_ip or 'unknown'}",
                 action="login.failed", outcome="failure", source_ip=source_ip,
                 details={"backend": "oidc", "reason": error.reason, **error.details})


def verify_id_token(chosen: Provider, id_token: Any, nonce: str) -> dict[str, Any]:
    """The ID token's claims, once every check has passed."""
    if not isinstance(id_token, str):
        _fail("the identity provider sent no ID token", "no-id-token")
    claims = _decode(chosen, id_token)
    failed = failed_claim(claims, issuer=chosen.issuer, client_id=chosen.client_id,
                          nonce=nonce, now=current_clock().now())
    if failed is not None:
        _fail("the identity provider's answer did not check out",
              f"id-token-{failed}".replace(" ", "-"))
    return claims


def failed_claim(claims: dict[str, Any], *, issuer: str, client_id: str, nonce: str,
                 now: datetime) -> str | None:
    """The first claim of a signature-checked ID token that does not check out, or None.

    OpenID Connect Core 1.0, section 3.1.3.7, one claim at a time; the same
    rules for the login and for a third-party connection.
    """
    audience = claims.get("aud")
    audiences = [audience] if isinstance(audience, str) else audience
    checks = [
        (claims.get("iss") == issuer, "issuer"),
        (isinstance(audiences, list) and client_id in audiences, "audience"),
        # azp, when present, must be us; with several audiences it must be present.
        (claims.get("azp") == client_id if "azp" in claims or (
            isinstance(audiences, list) and len(audiences) > 1) else True,
         "authorized party"),
        (_time(claims.get("exp")) is not None
         and now < _time(claims.get("exp")) + CLOCK_SKEW, "expiry"),  # type: ignore[operator]
        (_time(claims.get("iat")) is not None
         and _time(claims.get("iat")) < now + CLOCK_SKEW, "issue time"),  # type: ignore[operator]
        (isinstance(claims.get("nonce"), str)
         and hmac.compare_digest(claims["nonce"], nonce), "nonce"),
        (isinstance(claims.get("sub"), str) and 0 < len(claims["sub"]) <= 255, "subject"),
    ]
    return next((what for passed, what in checks if not passed), None)


def _decode(chosen: Provider, id_token: str) -> dict[str, Any]:
    for refresh in (False, True):  # a new signing key: fetch the JWKS once more
        try:
            return dict(jwt.decode(id_token, chosen.keys(refresh=refresh),
                                   algorithms=list(ALLOWED_ALGORITHMS)).claims)
        except (JoseError, ValueError) as error:
            reason = type(error).__name__
            if refresh:
                _fail("the identity provider's answer did not check out",
                      "id-token-signature", detail={"error": reason})
    raise AssertionError("unreachable")


def _time(value: Any) -> datetime | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return datetime.fromtimestamp(value, UTC)


def _fail(message: str, reason: str, detail: dict[str, Any] | None = None) -> NoReturn:
    raise LoginRefused(message, reason=reason, details=detail)
