"""The provider harness itself: discovery, the code flow with PKCE, faults, redirect URIs,
and connect-app (the provider as a third-party OAuth authorization server)."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
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
    scope: str = "openid profile email",
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
        "scope": scope,
        "state": state,
    }
    if "openid" in scope.split():
        params["nonce"] = nonce
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
    secret = client_secret or {
        provider.client_id: provider.client_secret,
        provider.other_client_id: provider.other_client_secret,
        provider.connect_client_id: provider.connect_client_secret,
    }[auth.client_id]
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
                 "end_session_endpoint", "revocation_endpoint"):
        assert document[name].startswith(f"{issuer}/"), name
    assert document["revocation_endpoint"] == f"{issuer}/token/revocation"
    assert document["userinfo_endpoint"] == f"{issuer}/me"
    assert set(document["grant_types_supported"]) == {"authorization_code", "refresh_token"}
    assert tuple(document["scopes_supported"]) == oidc_provider.scopes
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


def test_wrong_azp_keeps_the_audience_and_names_another_party(
    oidc_provider: OidcProvider,
) -> None:
    oidc_provider.set_fault("wrong_azp")
    auth, token = id_token_of(oidc_provider)
    # Every check but azp passes: the signature and audience are genuine.
    claims = verify(oidc_provider, token, auth)
    assert claims["aud"] == oidc_provider.client_id
    assert claims["azp"] == oidc_provider.other_client_id


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


# --- connect-app: a third-party OAuth authorization server ------------------------------


def connect_authorization(provider: OidcProvider, scope: str = "openid profile repo", *,
                          redirect_uri: str | None = None, **extra: str) -> Authorization:
    return authorization(provider, client_id=provider.connect_client_id,
                         redirect_uri=redirect_uri or provider.connect_redirect_uri, scope=scope,
                         **extra)


def userinfo(provider: OidcProvider, access_token: str) -> requests.Response:
    return new_session().get(provider.metadata()["userinfo_endpoint"], timeout=10,
                             headers={"Authorization": f"Bearer {access_token}"})


def api_user(provider: OidcProvider, access_token: str) -> requests.Response:
    return new_session().get(f"{provider.issuer}/api/user", timeout=10,
                             headers={"Authorization": f"Bearer {access_token}"})


def test_connect_code_flow_gives_access_and_refresh_tokens(oidc_provider: OidcProvider) -> None:
    auth = connect_authorization(oidc_provider)
    location = oidc_provider.connect_login(auth.url, "alice")
    params = callback_params(location, "https://gateway.test/oauth/callback/example")
    assert params["state"] == auth.state
    assert params["iss"] == oidc_provider.issuer

    response = exchange(oidc_provider, auth, params["code"])

    assert response.status_code == 200, response.text
    assert response.headers["Cache-Control"] == "no-store"
    tokens = response.json()
    assert set(tokens) == {"access_token", "refresh_token", "id_token", "token_type",
                           "expires_in", "scope"}
    assert tokens["token_type"] == "Bearer"
    assert tokens["expires_in"] == 300
    assert tokens["scope"] == "openid profile repo"
    assert tokens["access_token"] != tokens["refresh_token"]
    assert verify(oidc_provider, tokens["id_token"], auth)["aud"] == "connect-app"
    stats = oidc_provider.connect_stats()
    assert stats["token_calls"] == {"authorization_code": 1, "refresh_token": 0}
    assert stats["token_requests"] == [{"grant_type": "authorization_code",
                                        "auth_method": "client_secret_basic",
                                        "fault": None, "status": 200}]


def test_connect_without_openid_is_plain_oauth(oidc_provider: OidcProvider) -> None:
    auth = connect_authorization(oidc_provider, scope="repo read:user")
    code = callback_params(oidc_provider.connect_login(auth.url), auth.redirect_uri)["code"]
    response = exchange(oidc_provider, auth, code, basic=False)

    assert response.status_code == 200, response.text
    tokens = response.json()
    assert "id_token" not in tokens
    assert tokens["scope"] == "repo read:user"
    assert tokens["refresh_token"]
    assert oidc_provider.connect_stats()["token_requests"][0]["auth_method"] == (
        "client_secret_post")
    # userinfo is OpenID Connect's: it wants openid in the token's scope ...
    assert userinfo(oidc_provider, tokens["access_token"]).status_code == 403
    # ... the third-party API's own "who am I" does not.
    me = api_user(oidc_provider, tokens["access_token"])
    assert me.status_code == 200
    assert me.json() == {"sub": "alice", "preferred_username": "alice",
                         "name": "Alice Example", "email": "alice@example.test",
                         "client_id": "connect-app", "scope": "repo read:user"}
    assert api_user(oidc_provider, "not-a-token").status_code == 401


def test_connect_userinfo(oidc_provider: OidcProvider) -> None:
    tokens = oidc_provider.connect_tokens("bob", scope="openid read:user user:email")

    response = userinfo(oidc_provider, tokens["access_token"])

    assert response.status_code == 200, response.text
    assert response.json() == {"sub": "bob", "name": "Bob Example", "preferred_username": "bob",
                               "email": "bob@example.test", "email_verified": True}


def test_connect_asks_for_consent(oidc_provider: OidcProvider) -> None:
    session = new_session()
    auth = connect_authorization(oidc_provider)
    page = session.get(auth.url, timeout=10)
    action = f"{oidc_provider.issuer}{urlsplit(page.url).path}/login"
    consent = session.post(action, data={"login": "alice", "password": "password"}, timeout=10)
    assert 'id="consent"' in consent.text
    assert "Allow connect-app to access your account?" in consent.text
    assert "openid profile repo" in consent.text

    denied = oidc_provider.connect_login(connect_authorization(oidc_provider).url, deny=True)
    assert callback_params(denied, auth.redirect_uri)["error"] == "access_denied"
    # Once granted, the same scopes in the same browser session are not asked again.
    session = new_session()
    oidc_provider.connect_login(connect_authorization(oidc_provider).url, session=session)
    again = oidc_provider.connect_login(connect_authorization(oidc_provider).url, None,
                                        session=session)
    assert "code" in callback_params(again, auth.redirect_uri)


def test_refresh_rotates_the_refresh_token(oidc_provider: OidcProvider) -> None:
    first = oidc_provider.connect_tokens()

    response = oidc_provider.connect_refresh(first["refresh_token"])

    assert response.status_code == 200, response.text
    second = response.json()
    assert second["refresh_token"] != first["refresh_token"]
    assert second["access_token"] != first["access_token"]
    assert second["scope"] == "openid profile repo"
    assert second["expires_in"] == 300
    assert userinfo(oidc_provider, second["access_token"]).json()["sub"] == "alice"
    third = oidc_provider.connect_refresh(second["refresh_token"])
    assert third.status_code == 200, third.text

    # The rotated-out token is used up; sending it again is taken as theft and
    # ends the grant: the newest refresh token and access token stop working too.
    replay = oidc_provider.connect_refresh(first["refresh_token"])
    assert replay.status_code == 400
    assert replay.json()["error"] == "invalid_grant"
    assert oidc_provider.connect_refresh(third.json()["refresh_token"]).status_code == 400
    assert userinfo(oidc_provider, third.json()["access_token"]).status_code == 401
    assert oidc_provider.connect_stats()["token_calls"] == {"authorization_code": 1,
                                                           "refresh_token": 4}


def test_refresh_with_client_secret_post(oidc_provider: OidcProvider) -> None:
    tokens = oidc_provider.connect_tokens()
    response = new_session().post(oidc_provider.metadata()["token_endpoint"], timeout=10, data={
        "grant_type": "refresh_token", "refresh_token": tokens["refresh_token"],
        "client_id": oidc_provider.connect_client_id,
        "client_secret": oidc_provider.connect_client_secret})
    assert response.status_code == 200, response.text
    wrong = new_session().post(oidc_provider.metadata()["token_endpoint"], timeout=10, data={
        "grant_type": "refresh_token", "refresh_token": response.json()["refresh_token"]},
        auth=(oidc_provider.connect_client_id, "not-the-secret"))
    assert wrong.status_code == 401
    assert wrong.json()["error"] == "invalid_client"


@pytest.mark.parametrize("hint", [None, "refresh_token"])
def test_revoked_refresh_token_is_unusable(oidc_provider: OidcProvider, hint: str | None) -> None:
    tokens = oidc_provider.connect_tokens()

    response = oidc_provider.connect_revoke(tokens["refresh_token"], hint)

    assert response.status_code == 200
    refresh = oidc_provider.connect_refresh(tokens["refresh_token"])
    assert refresh.status_code == 400
    assert refresh.json()["error"] == "invalid_grant"
    # Revoking the refresh token ends its grant, access tokens included.
    assert userinfo(oidc_provider, tokens["access_token"]).status_code == 401
    assert oidc_provider.connect_stats()["revocations"] == [
        {"token_type_hint": hint, "token": tokens["refresh_token"], "found": "refresh_token",
         "auth_method": "client_secret_basic", "fault": None, "status": 200}]
    # Revoking it again, or any unknown token, is still 200 (RFC 7009).
    assert oidc_provider.connect_revoke(tokens["refresh_token"]).status_code == 200
    assert oidc_provider.connect_stats()["revocations"][1]["found"] is None


def test_revocation_with_client_secret_post(oidc_provider: OidcProvider) -> None:
    tokens = oidc_provider.connect_tokens()
    rotated = oidc_provider.connect_refresh(tokens["refresh_token"]).json()

    # The used-up refresh token is still known, and revoking it ends the grant.
    response = new_session().post(oidc_provider.metadata()["revocation_endpoint"], timeout=10,
                                  data={"token": tokens["refresh_token"],
                                        "client_id": oidc_provider.connect_client_id,
                                        "client_secret": oidc_provider.connect_client_secret})

    assert response.status_code == 200
    assert response.text == ""
    revocation = oidc_provider.connect_stats()["revocations"][0]
    assert (revocation["auth_method"], revocation["found"]) == (
        "client_secret_post", "refresh_token")
    assert oidc_provider.connect_refresh(rotated["refresh_token"]).status_code == 400


def test_connect_tokens_outlive_the_session_at_the_provider(
    oidc_provider: OidcProvider,
) -> None:
    session = new_session()
    auth = connect_authorization(oidc_provider)
    code = callback_params(oidc_provider.connect_login(auth.url, session=session),
                           auth.redirect_uri)["code"]
    tokens = exchange(oidc_provider, auth, code).json()

    assert oidc_provider.logout(session, oidc_provider.metadata()["end_session_endpoint"]) is None

    assert userinfo(oidc_provider, tokens["access_token"]).status_code == 200
    assert oidc_provider.connect_refresh(tokens["refresh_token"]).status_code == 200
    # Signed out: the next authorization asks for a login again.
    assert oidc_provider.connect_login(connect_authorization(oidc_provider).url, session=session)


def test_revoked_access_token_is_unusable(oidc_provider: OidcProvider) -> None:
    tokens = oidc_provider.connect_tokens()
    assert userinfo(oidc_provider, tokens["access_token"]).status_code == 200

    response = oidc_provider.connect_revoke(tokens["access_token"], "access_token")

    assert response.status_code == 200
    assert userinfo(oidc_provider, tokens["access_token"]).status_code == 401
    assert oidc_provider.connect_stats()["revocations"][0]["found"] == "access_token"
    # oidc-provider ends the whole grant here too: the refresh token goes with it.
    assert oidc_provider.connect_refresh(tokens["refresh_token"]).status_code == 400


def test_token_calls_are_counted_for_connect_app_only(oidc_provider: OidcProvider) -> None:
    tokens = oidc_provider.connect_tokens()
    oidc_provider.connect_refresh(tokens["refresh_token"])
    oidc_provider.id_token("alice")  # the gateway's client: not counted
    assert oidc_provider.connect_stats()["token_calls"] == {"authorization_code": 1,
                                                           "refresh_token": 1}

    oidc_provider.reset_connect_stats()

    stats = oidc_provider.connect_stats()
    assert stats["token_calls"] == {"authorization_code": 0, "refresh_token": 0}
    assert stats["token_requests"] == stats["revocations"] == []


def test_access_token_ttl(oidc_provider: OidcProvider) -> None:
    oidc_provider.set_connect(access_token_ttl=1)
    tokens = oidc_provider.connect_tokens()
    assert tokens["expires_in"] == 1
    assert userinfo(oidc_provider, tokens["access_token"]).status_code == 200

    time.sleep(1.5)

    assert userinfo(oidc_provider, tokens["access_token"]).status_code == 401
    refreshed = oidc_provider.connect_refresh(tokens["refresh_token"])
    assert refreshed.status_code == 200, refreshed.text
    assert refreshed.json()["expires_in"] == 1
    oidc_provider.set_connect(access_token_ttl=600)
    assert oidc_provider.connect_refresh(refreshed.json()["refresh_token"]).json()[
        "expires_in"] == 600


def test_grant_only_narrows_the_scope(oidc_provider: OidcProvider) -> None:
    oidc_provider.set_connect(grant_only=["read:user"])

    tokens = oidc_provider.connect_tokens(scope="openid read:user repo offline_access")

    assert tokens["scope"] == "openid read:user"
    refreshed = oidc_provider.connect_refresh(tokens["refresh_token"]).json()
    assert refreshed["scope"] == "openid read:user"
    assert api_user(oidc_provider, refreshed["access_token"]).json()["scope"] == (
        "openid read:user")
    oidc_provider.set_connect(grant_only=None)
    assert oidc_provider.connect_tokens(scope="openid repo")["scope"] == "openid repo"


def test_connect_redirect_uris(oidc_provider: OidcProvider) -> None:
    local = "https://localhost:8443/oauth/callback/example"
    auth = connect_authorization(oidc_provider, redirect_uri=local)
    assert new_session().get(auth.url, allow_redirects=False, timeout=10).status_code == 400

    oidc_provider.add_connect_redirect_uri(local)

    assert oidc_provider.connect_redirect_uris == ["https://gateway.test/oauth/callback/example",
                                                   local]
    assert oidc_provider.connect_stats()["redirect_uris"] == oidc_provider.connect_redirect_uris
    code = callback_params(oidc_provider.connect_login(auth.url), local)["code"]
    assert exchange(oidc_provider, auth, code).status_code == 200
    # The gateway client's redirect URIs are its own.
    assert oidc_provider.redirect_uris == ["https://gateway.test/login/callback"]
    oidc_provider.reset()
    assert oidc_provider.connect_redirect_uris == ["https://gateway.test/oauth/callback/example"]
    assert new_session().get(auth.url, allow_redirects=False, timeout=10).status_code == 400


# --- connect-app: faults -----------------------------------------------------------------


def test_token_fault_invalid_grant(oidc_provider: OidcProvider) -> None:
    tokens = oidc_provider.connect_tokens()
    oidc_provider.set_connect(token_fault="invalid_grant")

    for _ in range(2):  # until cleared
        response = oidc_provider.connect_refresh(tokens["refresh_token"])
        assert response.status_code == 400
        assert response.json()["error"] == "invalid_grant"

    # Nothing was spent: once cleared, the same refresh token works.
    oidc_provider.set_connect(token_fault=None)
    assert oidc_provider.connect_refresh(tokens["refresh_token"]).status_code == 200
    requests_seen = oidc_provider.connect_stats()["token_requests"]
    assert [(r["grant_type"], r["fault"], r["status"]) for r in requests_seen] == [
        ("authorization_code", None, 200),
        ("refresh_token", "invalid_grant", 400),
        ("refresh_token", "invalid_grant", 400),
        ("refresh_token", None, 200),
    ]


@pytest.mark.parametrize("fault", ["html", "oversize", "missing_access_token", "server_error"])
def test_token_faults(oidc_provider: OidcProvider, fault: str) -> None:
    tokens = oidc_provider.connect_tokens()
    oidc_provider.set_connect(token_fault=fault)

    response = oidc_provider.connect_refresh(tokens["refresh_token"])

    content_type = response.headers["Content-Type"]
    if fault == "html":
        assert response.status_code == 200
        assert content_type.startswith("text/html")
        assert response.text.startswith("<!doctype html>")
    elif fault == "oversize":
        assert response.status_code == 200
        assert content_type.startswith("application/json")
        assert len(response.content) > 64 * 1024
        assert response.json()["token_type"] == "Bearer"
    elif fault == "missing_access_token":
        assert response.status_code == 200
        assert content_type.startswith("application/json")
        assert response.json() == {"token_type": "Bearer", "expires_in": 300}
    else:
        assert response.status_code == 503
        assert response.json()["error"] == "server_error"
    oidc_provider.set_connect(token_fault=None)
    assert oidc_provider.connect_refresh(tokens["refresh_token"]).status_code == 200


@pytest.mark.parametrize(("fault", "status", "error"), [
    ("invalid_client", 401, "invalid_client"), ("invalid_request", 400, "invalid_request"),
    ("throttled", 429, "slow_down")])
def test_token_error_faults(oidc_provider: OidcProvider, fault: str, status: int,
                            error: str) -> None:
    tokens = oidc_provider.connect_tokens()
    oidc_provider.set_connect(token_fault=fault)

    response = oidc_provider.connect_refresh(tokens["refresh_token"])

    assert (response.status_code, response.json()["error"]) == (status, error)
    if fault == "throttled":
        assert response.headers["Retry-After"] == "120"
        oidc_provider.set_connect(retry_after="Wed, 21 Oct 2099 07:28:00 GMT")
        again = oidc_provider.connect_refresh(tokens["refresh_token"])
        assert again.headers["Retry-After"] == "Wed, 21 Oct 2099 07:28:00 GMT"
    if fault == "invalid_client":
        assert response.headers["WWW-Authenticate"].startswith("Basic")
    oidc_provider.set_connect(token_fault=None)
    assert oidc_provider.connect_refresh(tokens["refresh_token"]).status_code == 200


def test_token_fault_trickle_sends_the_genuine_answer_slowly(
    oidc_provider: OidcProvider,
) -> None:
    tokens = oidc_provider.connect_tokens()
    oidc_provider.set_connect(token_fault="trickle", slow_seconds=1.5)

    started = time.monotonic()
    # Each read gets a few bytes in time: only the whole takes long.
    response = oidc_provider.connect_refresh(tokens["refresh_token"])

    assert time.monotonic() - started >= 1.4
    assert response.status_code == 200
    assert response.json()["refresh_token"] != tokens["refresh_token"]


def test_answer_patch_changes_the_genuine_answer(oidc_provider: OidcProvider) -> None:
    tokens = oidc_provider.connect_tokens()
    oidc_provider.set_connect(answer_patch={"expires_in": 10**12, "token_type": "DPoP"},
                              fault_grant_types=["refresh_token"])

    answer = oidc_provider.connect_refresh(tokens["refresh_token"]).json()

    assert (answer["expires_in"], answer["token_type"]) == (10**12, "DPoP")
    # The answer is genuine otherwise: the refresh token really rotated.
    assert oidc_provider.connect_refresh(answer["refresh_token"]).status_code == 200
    # Limited to refreshes, it leaves the code exchange alone.
    assert oidc_provider.connect_tokens()["token_type"] == "Bearer"


def test_token_fault_applies_to_the_code_exchange_too(oidc_provider: OidcProvider) -> None:
    oidc_provider.set_connect(token_fault="server_error")
    with pytest.raises(OidcLoginError, match="503"):
        oidc_provider.connect_tokens()
    # Limited to refreshes, it leaves new connections alone.
    oidc_provider.set_connect(fault_grant_types=["refresh_token"])
    tokens = oidc_provider.connect_tokens()
    assert oidc_provider.connect_refresh(tokens["refresh_token"]).status_code == 503
    # Other clients never see connect-app's faults.
    oidc_provider.id_token("alice")


def test_token_fault_no_id_token(oidc_provider: OidcProvider) -> None:
    oidc_provider.set_connect(token_fault="no_id_token")
    # The genuine answer, code spent, without its ID token; without openid there is none anyway.
    tokens = oidc_provider.connect_tokens(scope="openid profile repo")
    assert "id_token" not in tokens
    assert api_user(oidc_provider, tokens["access_token"]).status_code == 200
    refreshed = oidc_provider.connect_refresh(tokens["refresh_token"])
    assert refreshed.status_code == 200
    assert "id_token" not in refreshed.json()
    oidc_provider.set_connect(token_fault=None)
    assert "id_token" in oidc_provider.connect_tokens(scope="openid profile repo")


def test_send_iss_false_drops_iss_from_connect_apps_authorization_responses(
    oidc_provider: OidcProvider,
) -> None:
    oidc_provider.set_connect(send_iss=False)
    auth = connect_authorization(oidc_provider)
    params = callback_params(oidc_provider.connect_login(auth.url, "alice"),
                             oidc_provider.connect_redirect_uri)
    assert "iss" not in params
    assert params["state"] == auth.state
    assert exchange(oidc_provider, auth, params["code"]).status_code == 200
    # The discovery document still promises it, as a provider might while a
    # man in the middle strips it; the gateway's own client keeps it.
    assert oidc_provider.metadata()["authorization_response_iss_parameter_supported"] is True
    oidc_provider.reset()
    again = connect_authorization(oidc_provider)
    assert "iss" in callback_params(oidc_provider.connect_login(again.url, "alice"),
                                    oidc_provider.connect_redirect_uri)


def test_discovery_fields_can_be_replaced_and_removed_until_reset(
    oidc_provider: OidcProvider,
) -> None:
    genuine = oidc_provider.metadata()
    assert genuine["code_challenge_methods_supported"] == ["S256"]
    oidc_provider.set_discovery(authorization_endpoint="http://idp.example.com/authorize",
                                authorization_response_iss_parameter_supported=None)
    changed = oidc_provider.metadata()
    assert changed["authorization_endpoint"] == "http://idp.example.com/authorize"
    assert "authorization_response_iss_parameter_supported" not in changed
    assert changed["token_endpoint"] == genuine["token_endpoint"]
    oidc_provider.set_discovery()
    assert oidc_provider.metadata() == genuine
    oidc_provider.set_discovery(code_challenge_methods_supported=["plain"])
    oidc_provider.reset()
    assert oidc_provider.metadata() == genuine


def test_token_fault_slow(oidc_provider: OidcProvider) -> None:
    tokens = oidc_provider.connect_tokens()
    oidc_provider.set_connect(token_fault="slow", slow_seconds=1)

    with pytest.raises(requests.Timeout):
        new_session().post(
            oidc_provider.metadata()["token_endpoint"], timeout=0.3,
            data={"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"]},
            auth=(oidc_provider.connect_client_id, oidc_provider.connect_client_secret))
    time.sleep(1)
    # The provider had handled the refresh before holding the answer back: the
    # refresh token sent is spent, although the client never saw its successor.
    oidc_provider.set_connect(token_fault=None)
    response = oidc_provider.connect_refresh(tokens["refresh_token"])
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_grant"

    fresh = oidc_provider.connect_tokens()
    oidc_provider.set_connect(token_fault="slow")
    started = time.monotonic()
    response = oidc_provider.connect_refresh(fresh["refresh_token"])
    assert time.monotonic() - started >= 1
    assert response.status_code == 200
    assert response.json()["refresh_token"] != fresh["refresh_token"]


def test_refresh_delay_leaves_a_window_for_concurrent_refreshes(
    oidc_provider: OidcProvider,
) -> None:
    tokens = oidc_provider.connect_tokens()
    oidc_provider.set_connect(refresh_delay_ms=500)

    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(oidc_provider.connect_refresh, [tokens["refresh_token"]] * 2))

    assert time.monotonic() - started >= 0.5
    # Both were in flight together; the provider rotated once, and took the
    # second use of the same refresh token as a replay.
    assert sorted(answer.status_code for answer in answers) == [200, 400]
    assert oidc_provider.connect_stats()["token_calls"]["refresh_token"] == 2


def test_revocation_fault_server_error(oidc_provider: OidcProvider) -> None:
    tokens = oidc_provider.connect_tokens()
    oidc_provider.set_connect(revocation_fault="server_error")

    response = oidc_provider.connect_revoke(tokens["refresh_token"], "refresh_token")

    assert response.status_code == 503
    assert oidc_provider.connect_refresh(tokens["refresh_token"]).status_code == 200
    assert oidc_provider.connect_stats()["revocations"][0]["status"] == 503


def test_revocation_fault_slow(oidc_provider: OidcProvider) -> None:
    tokens = oidc_provider.connect_tokens()
    oidc_provider.set_connect(revocation_fault="slow", slow_seconds=0.5)

    started = time.monotonic()
    response = oidc_provider.connect_revoke(tokens["refresh_token"])

    assert time.monotonic() - started >= 0.5
    assert response.status_code == 200
    assert oidc_provider.connect_refresh(tokens["refresh_token"]).status_code == 400


def test_connect_settings_are_checked_and_reset(oidc_provider: OidcProvider) -> None:
    with pytest.raises(ValueError, match="unknown token fault"):
        oidc_provider.set_connect(token_fault="teapot")
    with pytest.raises(ValueError, match="unknown revocation fault"):
        oidc_provider.set_connect(revocation_fault="html")
    with pytest.raises(AssertionError, match="invalid access_token_ttl"):
        oidc_provider.set_connect(access_token_ttl=0)
    defaults = {"access_token_ttl": 300, "grant_only": None, "token_fault": None,
                "fault_grant_types": None, "slow_seconds": 3, "refresh_delay_ms": 0,
                "revocation_fault": None, "retry_after": "120", "answer_patch": None,
                "send_iss": True}
    state = oidc_provider.set_connect(
        access_token_ttl=5, grant_only=["repo"], token_fault="slow",
        fault_grant_types=["refresh_token"], slow_seconds=2, refresh_delay_ms=100,
        revocation_fault="server_error", retry_after="7", answer_patch={"scope": "repo"},
        send_iss=False)
    assert {name: state[name] for name in defaults} == {
        "access_token_ttl": 5, "grant_only": ["repo"], "token_fault": "slow",
        "fault_grant_types": ["refresh_token"], "slow_seconds": 2, "refresh_delay_ms": 100,
        "revocation_fault": "server_error", "retry_after": "7",
        "answer_patch": {"scope": "repo"}, "send_iss": False}

    oidc_provider.reset()

    state = oidc_provider.connect_stats()
    assert {name: state[name] for name in defaults} == defaults
    assert state["token_faults"] == list(oidc_provider.token_faults)
    assert state["revocation_faults"] == list(oidc_provider.revocation_faults)
