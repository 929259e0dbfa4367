"""Talking to a third-party authorization server: the only module that does.

Authlib's ``OAuth2Session`` makes the token and revocation requests (client
authentication as the catalog says), on a session routed through the SSRF
guard whose answers may not exceed :data:`MAX_ANSWER`. The token endpoint's
answer is read here, not by Authlib: its status and ``error`` decide, the
same whatever Authlib version parses (RFC 6749 section 5.2). What comes back
is one of three outcomes: a token response that :func:`token_answer` checked
field by field, :class:`GrantRefused` (``invalid_grant``: the grant is gone,
the user must connect again), or :class:`ProviderUnavailable` (down, slow,
throttling, refusing the gateway's own client, or answering nonsense: try
later, nothing changes). Nothing here logs a token, a code or a response body.
"""

from __future__ import annotations

import email.utils
import logging
import math
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final
from urllib.parse import urlencode

import requests
from authlib.integrations.requests_client import OAuth2Session
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from flask import current_app
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from gateway.credentials.catalog import (
    CredentialType,
    OAuthProvider,
    current_catalog,
    provider_url_problem,
)
from gateway.errors import GatewayError
from gateway.identity.oidc import ALLOWED_ALGORITHMS, failed_claim
from gateway.outbound import (
    AnswerTooLarge,
    BlockedDestination,
    OutboundPolicy,
    bound_answers,
    guard_session,
)
from gateway.settings import Settings

log = logging.getLogger(__name__)

# Token responses are a few hundred bytes; anything this large is not one.
MAX_ANSWER: Final = 64 * 1024
DISCOVERY_TTL_SECONDS: Final = 3600
EXTENSION: Final = "gateway.oauth.providers"
# Each type's redirect URI is this path and the type's id (redirect_uri_of).
CALLBACK_PATH: Final = "/oauth/callback"
# How a revocation's outcome begins when the provider gave no answer.
NO_ANSWER: Final = "the provider did not answer"
# A token lifetime beyond this is a provider's mistake or a trap (a datetime
# overflow): it is cut to this, which still never needs a refresh.
MAX_EXPIRES_IN: Final = 10 * 365 * 24 * 3600
# A throttling provider's Retry-After is passed on, up to this: a caller told
# to wait a day would give up on the connection instead.
MAX_RETRY_AFTER: Final = 300
# RFC 6749 appendix A: tokens are VSCHARs, error codes NQSCHARs.
_VSCHARS: Final = re.compile(r"[\x20-\x7e]+")
_ERROR_CODE: Final = re.compile(r"[\x20\x21\x23-\x5b\x5d-\x7e]{1,64}")


class ProviderUnavailable(GatewayError):
    """The provider did not answer, or not with something usable; nothing changed."""

    status = 503
    code = "provider-unavailable"
    title = "The account's provider did not answer"
    retry_after = 30

    def __init__(self, detail: str | None = None, *, retry_after: int | None = None) -> None:
        super().__init__(detail)
        if retry_after is not None:
            self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class ClientRefused(ProviderUnavailable):
    """The provider refused the gateway's own client (``invalid_client``): the operator's to fix.

    Every user's connection would fail the same way, so none is ended: a
    rotated client secret, once set, brings them all back.
    """


class UnusableAnswer(ValueError):
    """A token answer with a field that is missing, of the wrong type, or not allowed."""


class DiscoveryRefused(ProviderUnavailable):
    """The provider's discovery document says something the gateway will not work with.

    Not an outage: no retry makes it better until the provider or the
    catalog changes, so ``gateway serve`` refuses to start on it.
    """


class GrantRefused(GatewayError):
    """The provider refused the grant (``invalid_grant``): the user must connect again."""

    status = 409
    code = "reconnect-required"
    title = "The user must connect the account again"

    def __init__(self, detail: str, error: str) -> None:
        super().__init__(detail)
        self.error = error


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where the provider's endpoints are: from the catalog, completed by discovery."""

    authorization: str
    token: str
    revocation: str | None
    userinfo: str | None
    issuer: str | None
    jwks: str | None
    # The discovery document promises ``iss`` in every authorization response (RFC 9207).
    iss_parameter: bool = False


def redirect_uri_of(public_url: str, type_id: str) -> str:
    """The type's own redirect URI, registered with its provider alone.

    One per type is the mix-up defence of RFC 9700 section 4.4.2: a return
    at one type's URI is never taken for another provider's.
    """
    return f"{public_url}{CALLBACK_PATH}/{type_id}"


class Provider:
    """One OAuth credential type's authorization server, as this gateway's client of it."""

    def __init__(self, credential_type: CredentialType, settings: Settings) -> None:
        assert credential_type.oauth is not None
        self.type_id = credential_type.id
        self.config: OAuthProvider = credential_type.oauth
        self.redirect_uri = redirect_uri_of(settings.public_url, credential_type.id)
        self._policy = OutboundPolicy.from_settings(settings)
        self._lock = threading.Lock()
        self._endpoints: Endpoints | None = None
        self._discovered_at = 0.0
        self._keys: KeySet | None = None

    # --- the authorization request ---------------------------------------------------

    def authorization_url(self, *, state: str, verifier: str, nonce: str | None,
                          scopes: tuple[str, ...]) -> str:
        """Where to send the browser: ``response_type=code``, ``state``, PKCE S256, ``nonce``."""
        query: dict[str, str] = dict(self.config.extra_authorize_params)
        query.update({
            "response_type": "code", "client_id": self.config.client_id,
            "redirect_uri": self.redirect_uri, "state": state,
            "code_challenge": create_s256_code_challenge(verifier),
            "code_challenge_method": "S256",
        })
        if scopes:
            query["scope"] = " ".join(scopes)
        if nonce is not None:
            query["nonce"] = nonce
        authorization = self.endpoints().authorization
        separator = "&" if "?" in authorization else "?"
        return f"{authorization}{separator}{urlencode(query)}"

    def is_openid(self, scopes: tuple[str, ...]) -> bool:
        """Whether the provider answers with an ID token: OpenID Connect, asked for ``openid``."""
        return self.config.issuer is not None and "openid" in scopes

    # --- the token endpoint ------------------------------------------------------------

    def exchange(self, code: str, verifier: str) -> dict[str, Any]:
        """Trade an authorization code for a token response (once: codes are single use)."""
        return self._token_request(grant_type="authorization_code", code=code,
                                   redirect_uri=self.redirect_uri, code_verifier=verifier)

    def refresh(self, refresh_token: str) -> dict[str, Any]:
        """A new token response for a refresh token; the provider may rotate the refresh token."""
        return self._token_request(grant_type="refresh_token", refresh_token=refresh_token)

    def _token_request(self, **parameters: str) -> dict[str, Any]:
        endpoint = self.endpoints().token
        with self._client() as client:
            try:
                answer = client.post(
                    endpoint, data=parameters, timeout=self._timeout(),
                    auth=client.client_auth(self.config.token_auth_method),
                    headers={"Accept": "application/json"})
                status, retry_after = answer.status_code, answer.headers.get("Retry-After")
                document = _json_object(answer)
            except (requests.RequestException, BlockedDestination) as error:
                raise self._unavailable("token request", error) from None
        if status != 200:
            raise self._token_error(status, document, retry_after)
        try:
            return token_answer(document)
        except UnusableAnswer as error:
            log.warning("%s: unusable token answer: %s", self.type_id, error)
            raise ProviderUnavailable(f"{self._name()} sent a token answer the gateway cannot "
                                      f"use: {error}") from None

    def _token_error(self, status: int, document: dict[str, Any] | None,
                     retry_after: str | None) -> GatewayError:
        """What a token endpoint's error answer means: only ``invalid_grant`` ends a grant."""
        # Error codes are defined by RFC 6749 and safe to show; descriptions
        # are the provider's free text and stay out of our pages and logs.
        error = document.get("error") if document is not None else None
        code = error if isinstance(error, str) and _ERROR_CODE.fullmatch(error) else None
        if code == "invalid_grant" and 400 <= status < 500 and status != 429:
            log.info("%s refused a token request: invalid_grant", self.type_id)
            return GrantRefused(f"{self._name()} refused: invalid_grant", code)
        if code == "invalid_client":
            # Not the user's doing: the client id or secret the catalog names
            # is wrong, or was rotated at the provider and not here.
            log.error("%s: the provider refused the gateway's client (invalid_client, HTTP "
                      "%d): check the client_id and client secret of this credential type",
                      self.type_id, status)
            return ClientRefused(f"{self._name()} does not accept the gateway's client "
                                 "(invalid_client); the gateway's operator must correct the "
                                 "credential type's client id or secret")
        reason = f"HTTP {status}" + (f" {code}" if code else "")
        log.warning("%s: token request failed: %s", self.type_id, reason)
        return ProviderUnavailable(f"{self._name()} answered {reason}; try again in a moment",
                                   retry_after=retry_after_seconds(retry_after))

    # --- revocation (RFC 7009) and userinfo ----------------------------------------------

    def revoke(self, token: str, hint: str) -> str:
        """Ask the provider to revoke a token; what happened, in a few words for the audit trail.

        It never raises for a provider that fails: a revocation here goes on
        whatever the provider does.
        """
        try:
            endpoint = self.endpoints().revocation
        except ProviderUnavailable as error:
            return f"{NO_ANSWER}: its discovery failed ({error.detail})"
        if endpoint is None:
            return "the provider has no revocation endpoint"
        with self._client() as client:
            try:
                answer = client.revoke_token(endpoint, token=token, token_type_hint=hint,
                                             timeout=self._timeout())
            except (requests.RequestException, BlockedDestination) as error:
                log.warning("%s: revocation failed: %s", self.type_id, type(error).__name__)
                return f"{NO_ANSWER} ({type(error).__name__})"
            status = answer.status_code
            answer.close()
        # RFC 7009 section 2.2: 200 whether or not the token was still valid.
        return "revoked at the provider" if status == 200 else \
            f"the provider answered HTTP {status}"

    def userinfo(self, access_token: str) -> dict[str, Any]:
        """The userinfo claims (to name the account), or {} when there is no endpoint."""
        endpoint = self.endpoints().userinfo
        if endpoint is None:
            return {}
        return self._get_json(endpoint, "userinfo request",
                              {"Authorization": f"Bearer {access_token}"})

    # --- ID tokens ----------------------------------------------------------------------

    def id_token_claims(self, id_token: str, nonce: str, now: datetime) -> dict[str, Any]:
        """The claims of an ID token whose signature, issuer, audience, expiry and nonce hold."""
        endpoints = self.endpoints()
        if endpoints.issuer is None or endpoints.jwks is None:
            raise ProviderUnavailable(f"{self._name()} sent an ID token it publishes no keys for")
        claims: dict[str, Any] | None = None
        for refresh in (False, True):  # a new signing key: fetch the key set once more
            try:
                claims = dict(jwt.decode(id_token, self._key_set(refresh=refresh),
                                         algorithms=list(ALLOWED_ALGORITHMS)).claims)
                break
            except (JoseError, ValueError):
                continue
        if claims is None:
            raise ProviderUnavailable(f"{self._name()} sent an ID token whose signature does "
                                      "not check out")
        failed = failed_claim(claims, issuer=endpoints.issuer, client_id=self.config.client_id,
                              nonce=nonce, now=now)
        if failed is not None:
            raise ProviderUnavailable(f"{self._name()} sent an ID token whose {failed} does not "
                                      "check out")
        return claims

    def _key_set(self, *, refresh: bool) -> KeySet:
        with self._lock:
            keys = self._keys
        if keys is None or refresh:
            jwks = self.endpoints().jwks
            assert jwks is not None
            keys = KeySet.import_key_set(self._get_json(jwks, "key set request"))  # type: ignore[arg-type]
            with self._lock:
                self._keys = keys
        return keys

    # --- discovery ----------------------------------------------------------------------

    def endpoints(self) -> Endpoints:
        """The endpoints; with an ``issuer``, discovered once an hour."""
        config = self.config
        if config.issuer is None:
            assert config.authorization_url is not None
            assert config.token_url is not None
            return Endpoints(config.authorization_url, config.token_url,
                             config.revocation_url, config.userinfo_url, None, None)
        with self._lock:
            if self._endpoints is not None and \
                    time.monotonic() - self._discovered_at < DISCOVERY_TTL_SECONDS:
                return self._endpoints
        try:
            found = self.discover()
        except DiscoveryRefused as refused:
            # A setting to change, at the provider or in the catalog: an error, not a warning.
            log.error("%s: %s", self.type_id, refused.detail)
            raise
        with self._lock:
            self._endpoints, self._discovered_at = found, time.monotonic()
        return found

    def discover(self, timeout: float | None = None) -> Endpoints:
        """The issuer's discovery document, fetched now (within ``timeout``) and checked.

        Raises :class:`DiscoveryRefused` for a document the gateway will not
        work with, :class:`ProviderUnavailable` for no usable answer.
        """
        issuer = self.config.issuer
        assert issuer is not None
        document = self._get_json(f"{issuer.rstrip('/')}/.well-known/openid-configuration",
                                  timeout=timeout)
        # OpenID Connect Discovery 1.0, section 4.3: the document must name
        # exactly the issuer asked for, or it may be someone else's.
        if document.get("issuer") != issuer:
            raise self._refused("names another issuer")
        # RFC 9700 section 2.1.1: a provider says it supports PKCE by listing
        # the method; one that does not may ignore the challenge, and the code
        # would then be usable by whoever intercepts it.
        methods = document.get("code_challenge_methods_supported")
        if not isinstance(methods, list) or "S256" not in methods:
            raise self._refused("does not list S256 in code_challenge_methods_supported (PKCE "
                                "S256 is required)")
        config = self.config

        def endpoint(setting: str | None, key: str) -> str | None:
            if setting is not None:
                return setting  # from the catalog, checked when it was loaded
            value = document.get(key)
            if value is None:
                return None
            # The same rule as for the catalog's URLs: a discovered endpoint
            # reaches the browser's redirect and the connect page's CSP.
            problem = provider_url_problem(value, self._policy.allows_insecure) \
                if isinstance(value, str) else "is not a string"
            if problem is not None:
                raise self._refused(f"is refused: its {key} {problem}")
            return str(value)

        authorization = endpoint(config.authorization_url, "authorization_endpoint")
        token = endpoint(config.token_url, "token_endpoint")
        if authorization is None or token is None:
            raise self._refused("lacks its authorization or token endpoint")
        return Endpoints(authorization, token,
                         endpoint(config.revocation_url, "revocation_endpoint"),
                         endpoint(config.userinfo_url, "userinfo_endpoint"), issuer,
                         endpoint(None, "jwks_uri"),
                         document.get("authorization_response_iss_parameter_supported") is True)

    def _refused(self, problem: str) -> DiscoveryRefused:
        return DiscoveryRefused(f"{self._name()}'s discovery document {problem}")

    def _get_json(self, url: str, what: str = "discovery",
                  headers: dict[str, str] | None = None,
                  timeout: float | None = None) -> dict[str, Any]:
        """A JSON object from the provider; ``what`` names the request in the log."""
        with self._http() as http:
            try:
                answer = http.get(url, timeout=(timeout, timeout) if timeout else self._timeout(),
                                  headers={"Accept": "application/json", **(headers or {})})
                answer.raise_for_status()
                document = answer.json()
            except (requests.RequestException, BlockedDestination, ValueError) as error:
                raise self._unavailable(what, error) from None
        if not isinstance(document, dict):
            raise ProviderUnavailable(f"{self._name()} answered the {what} with something "
                                      "other than a JSON object")
        return document

    # --- plumbing -----------------------------------------------------------------------

    def _client(self) -> OAuth2Session:
        config = self.config
        secret = config.client_secret.reveal() if config.client_secret is not None else None
        client = OAuth2Session(config.client_id, secret,
                               token_endpoint_auth_method=config.token_auth_method,
                               revocation_endpoint_auth_method=config.token_auth_method)
        return bound_answers(guard_session(client, self._policy), MAX_ANSWER)

    def _http(self) -> requests.Session:
        return bound_answers(guard_session(requests.Session(), self._policy), MAX_ANSWER)

    def _timeout(self) -> tuple[float, float]:
        return (self.config.timeout_seconds, self.config.timeout_seconds)

    def _name(self) -> str:
        return f"The provider ({self.config.host})"

    def _unavailable(self, what: str, error: Exception) -> ProviderUnavailable:
        if isinstance(error, BlockedDestination):
            # A setting, not an outage: the catalog names an endpoint the
            # outbound guard refuses. The log says which.
            log.error("%s: %s refused by the outbound guard: %s", self.type_id, what, error)
            return ProviderUnavailable(f"the gateway may not connect to {self.config.host} as "
                                       "configured; its operator must correct the credential "
                                       "type")
        if isinstance(error, AnswerTooLarge):
            reason = "an answer too large to be a token response"
        elif isinstance(error, ValueError):
            reason = "an answer that is not JSON"
        elif isinstance(error, requests.Timeout):
            reason = "no answer in time"
        elif isinstance(error, requests.HTTPError) and error.response is not None:
            reason = f"HTTP {error.response.status_code}"
        else:
            reason = "no answer"
        # The exception's text may hold a URL with a code in it: its type is enough.
        log.warning("%s: %s failed: %s (%s)", self.type_id, what, reason, type(error).__name__)
        return ProviderUnavailable(f"{self._name()} gave {reason}; try again in a moment")


def token_expiry(answer: Mapping[str, Any], now: datetime) -> datetime | None:
    """When the access token of a checked token answer expires; None if the provider did not say."""
    expires_in = answer.get("expires_in")
    return None if expires_in is None else now + timedelta(seconds=expires_in)


def token_answer(document: object) -> dict[str, Any]:
    """A token answer (RFC 6749 section 5.1), every field checked; :class:`UnusableAnswer` if not.

    The one check of what a provider sends, for the code exchange and the
    refresh alike, before anything is sealed or stored. Only the fields the
    gateway uses are kept, each in one shape: ``access_token`` (required),
    ``token_type`` (required, ``Bearer`` in any case: RFC 6749 section 7.1
    forbids using a token of a type the client does not understand),
    ``expires_in`` (whole seconds, cut to 0 to :data:`MAX_EXPIRES_IN`),
    ``refresh_token``, ``scope`` (a space-separated string) and ``id_token``.
    The messages name the field, never its value.
    """
    if not isinstance(document, dict):
        raise UnusableAnswer("it is not JSON, or not a JSON object")
    if "error" in document:
        raise UnusableAnswer("it carries an error with a success status")
    answer: dict[str, Any] = {"access_token": _token(document, "access_token")}
    if answer["access_token"] is None:
        raise UnusableAnswer("it came without an access_token")
    token_type = document.get("token_type")
    if not isinstance(token_type, str) or token_type.lower() != "bearer":
        raise UnusableAnswer("its token_type is not Bearer, the only type the gateway supports"
                             if token_type is not None else "it has no token_type")
    answer["token_type"] = "Bearer"  # noqa: S105 (a token type's name, not a secret)
    answer["expires_in"] = _expires_in(document.get("expires_in"))
    answer["refresh_token"] = _token(document, "refresh_token")
    answer["scope"] = _scope(document.get("scope"))
    id_token = document.get("id_token")
    if id_token is not None and not (isinstance(id_token, str) and _VSCHARS.fullmatch(id_token)):
        raise UnusableAnswer("its id_token is not a string of printable characters")
    answer["id_token"] = id_token
    return {name: value for name, value in answer.items() if value is not None}


def _token(document: Mapping[str, Any], name: str) -> str | None:
    value = document.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not _VSCHARS.fullmatch(value):
        raise UnusableAnswer(f"its {name} is not a string of printable characters")
    return value


def _expires_in(value: object) -> int | None:
    if value is None:
        return None
    # A number, as RFC 6749 says; a string of digits, as some providers send.
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            (isinstance(value, float) and math.isnan(value)):
        raise UnusableAnswer("its expires_in is not a number of seconds")
    return int(min(max(value, 0), MAX_EXPIRES_IN))


def _scope(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        value = " ".join(value)  # a few providers send a list
    if not isinstance(value, str) or (value and not _VSCHARS.fullmatch(value)):
        raise UnusableAnswer("its scope is not a string of scope names")
    return " ".join(value.split())


def _json_object(answer: requests.Response) -> dict[str, Any] | None:
    """The answer's body as a JSON object; None when it is anything else."""
    try:
        document = answer.json()
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def retry_after_seconds(value: str | None, now: datetime | None = None) -> int | None:
    """A ``Retry-After`` header (seconds or an HTTP date) as 1 to :data:`MAX_RETRY_AFTER` s."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return int(min(max(seconds, 1), MAX_RETRY_AFTER))


def providers() -> dict[str, Provider]:
    """This app's provider clients, one per OAuth credential type, made on first use."""
    found: dict[str, Provider] | None = current_app.extensions.get(EXTENSION)
    if found is None:
        found = current_app.extensions.setdefault(EXTENSION, {})
    return found


def provider_of(type_id: str) -> Provider | None:
    """The provider client of a type in this app's catalog; None unless it is an OAuth type."""
    credential_type = current_catalog().get(type_id)
    if credential_type is None or credential_type.oauth is None:
        return None
    return provider_for(credential_type)


def provider_for(credential_type: CredentialType) -> Provider:
    """The provider client of an OAuth credential type (its discovery cache is kept)."""
    registry = providers()
    chosen = registry.get(credential_type.id)
    if chosen is None or chosen.config is not credential_type.oauth:
        chosen = Provider(credential_type, current_app.extensions["gateway.settings"])
        registry[credential_type.id] = chosen
    return chosen
