"""The provider harness itself: discovery, the code flow with PKCE, faults, redirect URIs."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import requests
from joserfc import errors, jwt
from joserfc.jwk import KeySet, OctKey

from tests.oidc.fixtures import OidcLoginError, OidcProvider, new_session

pytestmark = [pytest.mark.slow, pytest.mark.backend_independent]


@dataclass
class Authorization:
    url: str
    state: str
    nonce: str
    verifier: str
    client_id: str
    redirect_uri: str


def authorization(
    provider: OidcProvider,
    *,
    client_id: str | None = None,
    redirect_uri: str | None = None,
    pkce: bool = True,
    **extra: str,
) -> Authorization:
    client_id = client_id or provider.client_id
    redirect_uri = redirect_uri or provider.redirect_uri
    state, nonce = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    verifier = secrets.token_urlsafe(48)
    params = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect_uri,
        "scope": "openid profile email",
        "state": state,
        "nonce": nonce,
    }
    if pkce:
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
        params["code_challenge"] = challenge.rstrip(b"=").decode()
        params["code_challenge_method"] = "S256"
    params.update(extra)
    url = f"{provider.metadata()['authorization_endpoint']}?{urlencode(params)}"
    return Authorization(url, state, nonce, verifier, client_id, redirect_uri)


def callback_params(location: str, redirect_uri: str) -> dict[str, str]:
    parts = urlsplit(location)
    assert f"{parts.scheme}://{parts.netloc}{parts.path}" == redirect_uri
    return {name: values[0] for name, values in parse_qs(parts.query).items()}


def exchange(
    provider: OidcProvider,
    auth: Authorization,
    code: str,
    *,
    verifier: str | None = None,
    client_secret: str | None = None,
    basic: bool = True,
) -> requests.Response:
    secret = client_secret or (
        provider.client_secret if auth.client_id == provider.client_id
        else provider.other_client_secret
    )
    data = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": auth.redirect_uri,
        "code_verifier": verifier or auth.verifier,
    }
    if basic:
        credentials: Any = (auth.client_id, secret)
    else:
        credentials = None
        data |= {"client_id": auth.client_id, "client_secret": secret}
    return new_session().post(
        provider.metadata()["token_endpoint"], data=data, auth=credentials, timeout=10
    )


def log_in(provider: OidcProvider, username: str = "alice", **kwargs: Any
           ) -> tuple[Authorization, str]:
    """A full login: returns the authorization and the code it produced."""
    auth = authorization(provider, **kwargs)
    location = provider.login(new_session(), auth.url, username)
    params = callback_params(location, auth.redirect_uri)
    assert params["state"] == auth.state
    return auth, params["code"]


def id_token_of(provider: OidcProvider, username: str = "alice") -> tuple[Authorization, str]:
    auth, code = log_in(provider, username)
    response = exchange(provider, auth, code)
    assert response.status_code == 200, response.text
    return auth, response.json()["id_token"]


def jwks(provider: OidcProvider) -> KeySet:
    response = new_session().get(provider.metadata()["jwks_uri"], timeout=10)
    response.raise_for_status()
    return KeySet.import_key_set(response.json())


def unverified(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    def part(segment: str) -> dict[str, Any]:
        padded = segment + "=" * (-len(segment) % 4)
        decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(padded))
        return decoded
    header, payload = token.split(".")[:2]
    return part(header), part(payload)


def verify(provider: OidcProvider, token: str, auth: Authorization) -> dict[str, Any]:
    """What the gateway will do: signature against the JWKS, then exact claims."""
    decoded = jwt.decode(token, jwks(provider), algorithms=["RS256"])
    jwt.JWTClaimsRegistry(
        iss={"essential": True, "value": provider.issuer},
        aud={"essential": True, "value": auth.client_id},
        nonce={"essential": True, "value": auth.nonce},
        sub={"essential": True},
        exp={"essential": True},
        iat={"essential": True},
    ).validate(decoded.claims)
    return decoded.claims


# --- discovery and the genuine flow ---------------------------------------------------


def test_discovery_document(oidc_provider: OidcProvider) -> None:
    document = oidc_provider.metadata()
    issuer = oidc_provider.issuer
    assert issuer.startswith("http://127.0.0.1:")
    assert document["issuer"] == issuer
    for name in ("authorization_endpoint", "token_endpoint", "jwks_uri", "userinfo_endpoint",
                 "end_session_endpoint"):
        assert document[name].startswith(f"{issuer}/"), name
    assert document["response_types_supported"] == ["code"]
    assert document["code_challenge_methods_supported"] == ["S256"]
    assert document["id_token_signing_alg_values_supported"] == ["RS256"]
    assert set(document["token_endpoint_auth_methods_supported"]) == {
        "client_secret_basic", "client_secret_post"
    }
    assert document["authorization_response_iss_parameter_supported"] is True


def test_code_flow_with_pkce(oidc_provider: OidcProvider) -> None:
    auth = authorization(oidc_provider)
    location = oidc_provider.login(new_session(), auth.url, "alice")

    params = callback_params(location, auth.redirect_uri)
    assert params["state"] == auth.state
    assert params["iss"] == oidc_provider.issuer
    response = exchange(oidc_provider, auth, params["code"])
    assert response.status_code == 200, response.text
    tokens = response.json()
    assert tokens["token_type"].lower() == "bearer"

    claims = verify(oidc_provider, tokens["id_token"], auth)
    assert claims["sub"] == "alice"
    assert claims["email"] == "alice@example.test"
    assert claims["exp"] > time.time() > claims["iat"] - 5


def test_client_secret_post(oidc_provider: OidcProvider) -> None:
    auth, code = log_in(oidc_provider, "bob")
    response = exchange(oidc_provider, auth, code, basic=False)
    assert response.status_code == 200, response.text
    assert verify(oidc_provider, response.json()["id_token"], auth)["sub"] == "bob"


def test_signed_in_session_skips_the_login_form(oidc_provider: OidcProvider) -> None:
    session = new_session()
    first = authorization(oidc_provider)
    oidc_provider.login(session, first.url, "carol")
    second = authorization(oidc_provider)

    with pytest.raises(OidcLoginError, match="signed in already"):
        oidc_provider.login(session, second.url, "carol")
    location = oidc_provider.login(session, authorization(oidc_provider).url, None)
    assert "code" in callback_params(location, oidc_provider.redirect_uri)
    # prompt=login asks again, whoever is signed in.
    again = authorization(oidc_provider, prompt="login")
    location = oidc_provider.login(session, again.url, "alice")
    code = callback_params(location, again.redirect_uri)["code"]
    response = exchange(oidc_provider, again, code)
    assert verify(oidc_provider, response.json()["id_token"], again)["sub"] == "alice"


def test_other_app_gets_a_consent_screen(oidc_provider: OidcProvider) -> None:
    auth = authorization(oidc_provider, client_id=oidc_provider.other_client_id,
                         redirect_uri="https://other-app.test/callback")
    session = new_session()
    response = session.get(auth.url, allow_redirects=True, timeout=10)
    assert 'id="login"' in response.text

    location = oidc_provider.login(new_session(), auth.url, "alice")
    code = callback_params(location, auth.redirect_uri)["code"]
    response = exchange(oidc_provider, auth, code)
    assert response.status_code == 200, response.text
    assert verify(oidc_provider, response.json()["id_token"], auth)["aud"] == "other-app"


def test_rp_initiated_logout(oidc_provider: OidcProvider) -> None:
    session = new_session()
    auth = authorization(oidc_provider)
    code = callback_params(oidc_provider.login(session, auth.url, "alice"), auth.redirect_uri)
    id_token = exchange(oidc_provider, auth, code["code"]).json()["id_token"]
    params = {
        "id_token_hint": id_token,
        "post_logout_redirect_uri": oidc_provider.post_logout_redirect_uris[0],
        "state": "after-logout",
    }
    end_session = f"{oidc_provider.metadata()['end_session_endpoint']}?{urlencode(params)}"

    location = oidc_provider.logout(session, end_session)

    assert location == "https://gateway.test/?state=after-logout"
    # Signed out: the next authorization asks for a login again.
    assert oidc_provider.login(session, authorization(oidc_provider).url, "alice")


# --- what the provider refuses ----------------------------------------------------------


def test_replayed_code_is_rejected(oidc_provider: OidcProvider) -> None:
    auth, code = log_in(oidc_provider)
    first = exchange(oidc_provider, auth, code)
    assert first.status_code == 200
    userinfo = oidc_provider.metadata()["userinfo_endpoint"]
    bearer = {"Authorization": f"Bearer {first.json()['access_token']}"}
    assert new_session().get(userinfo, headers=bearer, timeout=10).json()["sub"] == "alice"

    replay = exchange(oidc_provider, auth, code)
    assert replay.status_code == 400
    assert replay.json()["error"] == "invalid_grant"
    # The replay also revoked what the code had produced.
    assert new_session().get(userinfo, headers=bearer, timeout=10).status_code == 401


def test_wrong_code_verifier_is_rejected(oidc_provider: OidcProvider) -> None:
    auth, code = log_in(oidc_provider)
    response = exchange(oidc_provider, auth, code, verifier=secrets.token_urlsafe(48))
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_grant"


def test_wrong_client_secret_is_rejected(oidc_provider: OidcProvider) -> None:
    auth, code = log_in(oidc_provider)
    response = exchange(oidc_provider, auth, code, client_secret="not-the-secret")
    assert response.status_code == 401
    assert response.json()["error"] == "invalid_client"


def test_pkce_is_required(oidc_provider: OidcProvider) -> None:
    auth = authorization(oidc_provider, pkce=False)
    location = new_session().get(auth.url, allow_redirects=False, timeout=10).headers["Location"]
    params = callback_params(location, auth.redirect_uri)
    assert params["error"] == "invalid_request"
    assert "PKCE" in params["error_description"]


def test_wrong_password_or_unknown_account_is_refused(oidc_provider: OidcProvider) -> None:
    with pytest.raises(OidcLoginError, match="401"):
        oidc_provider.login(None, authorization(oidc_provider).url, "alice", "wrong")
    with pytest.raises(OidcLoginError, match="401"):
        oidc_provider.login(None, authorization(oidc_provider).url, "mallory")


def test_cancelled_login_returns_access_denied(oidc_provider: OidcProvider) -> None:
    auth = authorization(oidc_provider)
    session = new_session()
    page = session.get(auth.url, timeout=10)
    uid = urlsplit(page.url).path.rsplit("/", 1)[1]
    response = session.get(f"{oidc_provider.issuer}/interaction/{uid}/abort",
                           allow_redirects=False, timeout=10)
    location = oidc_provider.login(session, response.headers["Location"], None)
    assert callback_params(location, auth.redirect_uri)["error"] == "access_denied"


# --- redirect URIs --------------------------------------------------------------------


def test_unregistered_redirect_uri_is_not_redirected_to(oidc_provider: OidcProvider) -> None:
    local = "https://localhost:8443/login/callback"
    auth = authorization(oidc_provider, redirect_uri=local)
    response = new_session().get(auth.url, allow_redirects=False, timeout=10)
    assert response.status_code == 400
    assert "redirect_uri did not match" in response.text

    oidc_provider.add_redirect_uri(local)
    assert oidc_provider.redirect_uris == ["https://gateway.test/login/callback", local]
    location = oidc_provider.login(None, auth.url, "alice")
    assert "code" in callback_params(location, local)

    oidc_provider.reset()
    assert new_session().get(auth.url, allow_redirects=False, timeout=10).status_code == 400


# --- faults ---------------------------------------------------------------------------


def test_no_fault_by_default(oidc_provider: OidcProvider) -> None:
    auth, token = id_token_of(oidc_provider)
    verify(oidc_provider, token, auth)


def test_unknown_fault_is_refused(oidc_provider: OidcProvider) -> None:
    with pytest.raises(ValueError, match="unknown ID token fault"):
        oidc_provider.set_fault("wrong_everything")


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("wrong_audience", errors.InvalidClaimError),
        ("wrong_issuer", errors.InvalidClaimError),
        ("expired", errors.ExpiredTokenError),
        ("wrong_nonce", errors.InvalidClaimError),
        ("missing_nonce", errors.MissingClaimError),
    ],
)
def test_claim_faults_keep_a_valid_signature(
    oidc_provider: OidcProvider, fault: str, error: type[Exception]
) -> None:
    oidc_provider.set_fault(fault)
    auth, token = id_token_of(oidc_provider)

    header, claims = unverified(token)
    assert header == {"alg": "RS256", "kid": jwks(oidc_provider).keys[0].kid}
    # The signature is the provider's own: only the claim under test is wrong.
    assert jwt.decode(token, jwks(oidc_provider), algorithms=["RS256"]).claims == claims
    assert claims["sub"] == "alice"
    faulted = {
        "wrong_audience": claims["aud"] == "other-app",
        "wrong_issuer": claims["iss"] == "http://evil.example",
        "expired": claims["exp"] < time.time() - 600,
        "wrong_nonce": claims.get("nonce") not in (None, auth.nonce),
        "missing_nonce": "nonce" not in claims,
    }
    assert [name for name, yes in faulted.items() if yes] == [fault]
    with pytest.raises(error):
        verify(oidc_provider, token, auth)


def test_bad_signature(oidc_provider: OidcProvider) -> None:
    oidc_provider.set_fault("bad_signature")
    auth, token = id_token_of(oidc_provider)
    header, claims = unverified(token)
    assert header["kid"] == jwks(oidc_provider).keys[0].kid
    assert claims["nonce"] == auth.nonce
    with pytest.raises(errors.BadSignatureError):
        verify(oidc_provider, token, auth)


def test_unknown_kid(oidc_provider: OidcProvider) -> None:
    oidc_provider.set_fault("unknown_kid")
    auth, token = id_token_of(oidc_provider)
    assert unverified(token)[0]["kid"] not in {key.kid for key in jwks(oidc_provider).keys}
    with pytest.raises(errors.InvalidKeyIdError):
        verify(oidc_provider, token, auth)


def test_alg_none(oidc_provider: OidcProvider) -> None:
    oidc_provider.set_fault("alg_none")
    auth, token = id_token_of(oidc_provider)
    assert unverified(token)[0] == {"alg": "none"}
    assert token.endswith(".")
    with pytest.raises(errors.JoseError):
        verify(oidc_provider, token, auth)


def test_alg_hs256_signed_with_the_client_secret(oidc_provider: OidcProvider) -> None:
    oidc_provider.set_fault("alg_hs256")
    auth, token = id_token_of(oidc_provider)
    assert unverified(token)[0] == {"alg": "HS256"}
    secret = OctKey.import_key(oidc_provider.client_secret.encode())
    assert jwt.decode(token, secret, algorithms=["HS256"]).claims["nonce"] == auth.nonce
    with pytest.raises(errors.JoseError):
        verify(oidc_provider, token, auth)


def test_reset_ends_the_fault(oidc_provider: OidcProvider) -> None:
    oidc_provider.set_fault("wrong_issuer")
    oidc_provider.reset()
    auth, token = id_token_of(oidc_provider)
    verify(oidc_provider, token, auth)
