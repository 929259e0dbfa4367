"""A real OpenID Connect provider on loopback for the gateway's tests.

Load as a plugin (``pytest_plugins = ["tests.oidc.fixtures"]`` in tests/conftest.py)
and ask for the session-scoped ``oidc_provider`` fixture. It runs panva's
oidc-provider (tests/oidc/provider.mjs) under Node.js, installs its node modules
first when they are missing or stale, and stops it at the end of the run. Faults
and redirect URIs a test sets are reset after that test. README.md in this
directory describes the provider, its login pages and its test endpoints.

The provider also acts as a third-party OAuth authorization server for the
client ``connect-app`` (refresh tokens that rotate, revocation, faults of the
token endpoint): see ``OidcProvider.set_connect`` and ``connect_stats``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import queue
import secrets
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import pytest
import requests

OIDC_DIR = Path(__file__).resolve().parent
LOCKFILE = OIDC_DIR / "package-lock.json"
NODE_MODULES = OIDC_DIR / "node_modules"

CLIENT_ID = "gateway"
CLIENT_SECRET = "gateway-test-client-secret-" + "c" * 24
OTHER_CLIENT_ID = "other-app"
OTHER_CLIENT_SECRET = "other-app-test-client-secret-" + "o" * 24
OTHER_REDIRECT_URI = "https://other-app.test/callback"
CONNECT_CLIENT_ID = "connect-app"
CONNECT_CLIENT_SECRET = "connect-app-test-client-secret-" + "k" * 24
# The gateway's redirect URI for its OAuth type "example" (each type has its own).
CONNECT_REDIRECT_URIS = ("https://gateway.test/oauth/callback/example",)
# The scopes the provider knows; connect-app may ask for any of them.
SCOPES = ("openid", "offline_access", "profile", "email", "repo", "read:user", "user:email")
# connect-app's token endpoint faults (set_connect(token_fault=...)) and
# revocation endpoint faults (set_connect(revocation_fault=...)).
TOKEN_FAULTS = (
    "invalid_grant",
    "html",
    "oversize",
    "slow",
    "missing_access_token",
    "server_error",
    "invalid_client",
    "invalid_request",
    "throttled",
    "trickle",
    "no_id_token",
)
REVOCATION_FAULTS = ("slow", "server_error")
REDIRECT_URIS = ("https://gateway.test/login/callback",)
POST_LOGOUT_REDIRECT_URIS = ("https://gateway.test/",)
ACCOUNTS = ("alice", "bob", "carol")
PASSWORD = "password"
ID_TOKEN_FAULTS = (
    "wrong_audience",
    "wrong_issuer",
    "wrong_azp",
    "bad_signature",
    "unknown_kid",
    "expired",
    "wrong_nonce",
    "missing_nonce",
    "alg_none",
    "alg_hs256",
)

START_TIMEOUT = 30.0
HTTP_TIMEOUT = 10.0


class _Unset:
    """The default of ``set_connect``'s arguments: leave that setting as it is."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


class OidcLoginError(AssertionError):
    """The provider did not lead the login to a redirect back to the client."""


def node_modules_stamp() -> Path:
    """The file that marks node_modules as installed from the current lockfile.

    ``./dev test`` uses the same name, so either one installing is enough.
    """
    digest = hashlib.sha256(LOCKFILE.read_bytes()).hexdigest()[:16]
    return NODE_MODULES / f".installed-{digest}"


class NodeUnavailable(Exception):
    """Node.js, npm or the provider's node modules are missing and cannot be had here."""


def _unavailable(reason: str) -> NoReturn:
    # A developer without Node.js skips these tests; CI must run them.
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so the OpenID Connect tests must run)", pytrace=False)
    pytest.skip(reason)


def node_command() -> str:
    """The ``node`` to run the provider with; :class:`NodeUnavailable` when there is none."""
    node = shutil.which("node")
    if node is None:
        raise NodeUnavailable("Node.js (node) is not installed: the OpenID Connect provider "
                              "cannot run")
    return node


def install_node_modules() -> None:
    """``npm ci`` in tests/oidc, unless node_modules was installed from the current lockfile."""
    stamp = node_modules_stamp()
    if stamp.exists():
        return
    npm = shutil.which("npm")
    if npm is None:
        raise NodeUnavailable("npm is not installed: cannot install tests/oidc/node_modules")
    try:
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=OIDC_DIR,
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.CalledProcessError as error:
        raise NodeUnavailable(
            f"npm ci in tests/oidc failed:\n{error.stdout}{error.stderr}"
        ) from None
    except subprocess.TimeoutExpired:
        raise NodeUnavailable("npm ci in tests/oidc timed out") from None
    stamp.touch()


def new_session() -> requests.Session:
    """A requests session that ignores proxy settings (the provider is on loopback)."""
    session = requests.Session()
    session.trust_env = False
    return session


@dataclass
class _Form:
    id: str
    action: str
    fields: dict[str, str]


class _FormParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.forms: list[_Form] = []
        self.links: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {name: value or "" for name, value in attrs}
        if tag == "a" and attributes.get("id") and "href" in attributes:
            self.links[attributes["id"]] = attributes["href"]
        elif tag == "form":
            self.forms.append(_Form(attributes.get("id", ""), attributes.get("action", ""), {}))
        elif tag == "input" and self.forms and "name" in attributes:
            self.forms[-1].fields[attributes["name"]] = attributes.get("value", "")


def _forms(html: str) -> list[_Form]:
    return _parse(html).forms


def _parse(html: str) -> _FormParser:
    parser = _FormParser()
    parser.feed(html)
    return parser


@dataclass
class OidcProvider:
    """A running provider, and what a test needs to talk to it."""

    issuer: str
    log_path: Path
    process: subprocess.Popen[str] = field(repr=False)
    client_id: str = CLIENT_ID
    client_secret: str = CLIENT_SECRET
    other_client_id: str = OTHER_CLIENT_ID
    other_client_secret: str = OTHER_CLIENT_SECRET
    # Its own redirect URI, then a loopback one where a native-style client
    # (examples/weather_client.py) can receive the code.
    other_redirect_uris: tuple[str, ...] = (OTHER_REDIRECT_URI,)
    accounts: tuple[str, ...] = ACCOUNTS
    password: str = PASSWORD
    faults: tuple[str, ...] = ID_TOKEN_FAULTS
    redirect_uris: list[str] = field(default_factory=lambda: list(REDIRECT_URIS))
    post_logout_redirect_uris: list[str] = field(
        default_factory=lambda: list(POST_LOGOUT_REDIRECT_URIS)
    )
    # The third-party OAuth client the gateway connects users' accounts to.
    connect_client_id: str = CONNECT_CLIENT_ID
    connect_client_secret: str = CONNECT_CLIENT_SECRET
    connect_redirect_uris: list[str] = field(
        default_factory=lambda: list(CONNECT_REDIRECT_URIS)
    )
    scopes: tuple[str, ...] = SCOPES
    token_faults: tuple[str, ...] = TOKEN_FAULTS
    revocation_faults: tuple[str, ...] = REVOCATION_FAULTS
    _admin: requests.Session = field(default_factory=new_session, repr=False)

    # --- where things are ---------------------------------------------------------

    @property
    def discovery_url(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"

    @property
    def redirect_uri(self) -> str:
        """The gateway client's first redirect URI."""
        return self.redirect_uris[0]

    @property
    def connect_redirect_uri(self) -> str:
        """connect-app's first redirect URI."""
        return self.connect_redirect_uris[0]

    def metadata(self) -> dict[str, Any]:
        """The provider's discovery document."""
        response = self._admin.get(self.discovery_url, timeout=HTTP_TIMEOUT)
        response.raise_for_status()
        document: dict[str, Any] = response.json()
        return document

    def log(self) -> str:
        """What the provider wrote to stderr so far (one line per request)."""
        return self.log_path.read_text(errors="replace")

    # --- test controls ------------------------------------------------------------

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self._admin.post(f"{self.issuer}{path}", json=body, timeout=HTTP_TIMEOUT)
        if response.status_code != 200:
            raise AssertionError(f"{path}: {response.status_code} {response.text}")
        state: dict[str, Any] = response.json()
        return state

    def set_fault(self, name: str | None) -> None:
        """Make the token endpoint return a faulty ID token (None: genuine again).

        Until reset, every token response carries the faulted variant of the
        token the provider issued; see ``faults`` for the names.
        """
        if name is not None and name not in self.faults:
            raise ValueError(f"unknown ID token fault {name!r}; one of {self.faults}")
        self._post("/__test__/faults", {"id_token": name})

    def set_redirect_uris(
        self, redirect_uris: list[str], post_logout_redirect_uris: list[str] | None = None
    ) -> None:
        """Register other redirect URIs for the gateway client, until reset."""
        body: dict[str, Any] = {"redirect_uris": list(redirect_uris)}
        if post_logout_redirect_uris is not None:
            body["post_logout_redirect_uris"] = list(post_logout_redirect_uris)
        self._post("/__test__/client", body)
        self.redirect_uris = list(redirect_uris)
        if post_logout_redirect_uris is not None:
            self.post_logout_redirect_uris = list(post_logout_redirect_uris)

    def add_redirect_uri(self, uri: str) -> None:
        """Allow one more redirect URI for the gateway client, until reset."""
        if uri not in self.redirect_uris:
            self.set_redirect_uris([*self.redirect_uris, uri])

    def set_discovery(self, **fields: Any) -> dict[str, Any]:
        """Replace fields of the discovery document (``None`` removes one), until reset.

        Every call replaces the previous overrides; ``set_discovery()`` ends them.
        Every client sees the changed document.
        """
        return self._post("/__test__/discovery", fields)

    def reset(self) -> None:
        """No faults, the clients' initial redirect URIs, connect-app's defaults and no stats;
        the genuine discovery document."""
        self._post("/__test__/reset", {})
        self.redirect_uris = list(REDIRECT_URIS)
        self.post_logout_redirect_uris = list(POST_LOGOUT_REDIRECT_URIS)
        self.connect_redirect_uris = list(CONNECT_REDIRECT_URIS)

    # --- connect-app: the provider as a third-party OAuth authorization server ---

    def set_connect_redirect_uris(self, redirect_uris: list[str]) -> None:
        """Register other redirect URIs for connect-app, until reset."""
        self._post("/__test__/client",
                   {"client": self.connect_client_id, "redirect_uris": list(redirect_uris)})
        self.connect_redirect_uris = list(redirect_uris)

    def add_connect_redirect_uri(self, uri: str) -> None:
        """Allow one more redirect URI for connect-app, until reset."""
        if uri not in self.connect_redirect_uris:
            self.set_connect_redirect_uris([*self.connect_redirect_uris, uri])

    def set_connect(
        self,
        *,
        access_token_ttl: int = UNSET,
        grant_only: list[str] | None = UNSET,
        token_fault: str | None = UNSET,
        fault_grant_types: list[str] | None = UNSET,
        slow_seconds: float = UNSET,
        refresh_delay_ms: int = UNSET,
        revocation_fault: str | None = UNSET,
        retry_after: str | None = UNSET,
        answer_patch: dict[str, Any] | None = UNSET,
        send_iss: bool = UNSET,
    ) -> dict[str, Any]:
        """Change how the provider treats connect-app, until reset; returns ``connect_stats()``.

        Arguments left out keep their value; ``None`` ends a fault or ``grant_only``.

        - ``access_token_ttl``: seconds its new access tokens live (``expires_in``; 300).
        - ``grant_only``: at the consent page the user grants only these of the
          requested scopes (and ``openid``); the others are rejected.
        - ``token_fault``: one of ``token_faults``, answering its token requests
          from now on; ``fault_grant_types`` limits it to some grant types.
        - ``slow_seconds``: how long ``slow`` holds an answer back, and
          ``trickle`` spreads it over (3).
        - ``refresh_delay_ms``: each refresh_token request waits this long
          before the provider handles it (0).
        - ``revocation_fault``: one of ``revocation_faults``, for its revocation requests.
        - ``retry_after``: the ``Retry-After`` header of ``throttled`` (``"120"``;
          ``None``: no header).
        - ``answer_patch``: fields merged into its genuine token answers (200),
          for the grant types ``fault_grant_types`` names, e.g.
          ``{"expires_in": 10**12}``; ``None`` ends it.
        - ``send_iss``: ``False`` drops ``iss`` (RFC 9207) from its authorization
          responses; the discovery document still advertises it (see ``set_discovery``).
        """
        settings = {
            "access_token_ttl": access_token_ttl,
            "grant_only": grant_only,
            "token_fault": token_fault,
            "fault_grant_types": fault_grant_types,
            "slow_seconds": slow_seconds,
            "refresh_delay_ms": refresh_delay_ms,
            "revocation_fault": revocation_fault,
            "retry_after": retry_after,
            "answer_patch": answer_patch,
            "send_iss": send_iss,
        }
        body = {
            name: list(value) if isinstance(value, (list, tuple)) else value
            for name, value in settings.items()
            if value is not UNSET
        }
        if token_fault not in (UNSET, None) and token_fault not in self.token_faults:
            raise ValueError(f"unknown token fault {token_fault!r}; one of {self.token_faults}")
        if revocation_fault not in (UNSET, None) and revocation_fault not in self.revocation_faults:
            raise ValueError(
                f"unknown revocation fault {revocation_fault!r}; one of {self.revocation_faults}"
            )
        return self._post("/__test__/connect", body)

    def connect_stats(self) -> dict[str, Any]:
        """connect-app's settings and what the provider saw of it since the last reset.

        ``token_calls`` counts its token requests per grant type,
        ``token_requests`` and ``revocations`` list them in order; the other
        keys are the settings of ``set_connect`` and its ``redirect_uris``.
        """
        response = self._admin.get(f"{self.issuer}/__test__/connect", timeout=HTTP_TIMEOUT)
        response.raise_for_status()
        state: dict[str, Any] = response.json()
        return state

    def reset_connect_stats(self) -> None:
        """Zero connect-app's counters and lists (its settings stay)."""
        self._post("/__test__/connect", {"reset_stats": True})

    def connect_login(
        self,
        authorize_url: str,
        username: str | None = "alice",
        password: str | None = None,
        *,
        session: requests.Session | None = None,
        deny: bool = False,
    ) -> str:
        """Authorize connect-app at ``authorize_url``; the redirect back to its redirect URI.

        ``login`` with a consent step: the user allows (or with ``deny``
        cancels, which ends in ``error=access_denied``). ``authorize_url`` may
        come from anywhere, e.g. the gateway's redirect to the provider.
        """
        return self.login(session, authorize_url, username, password, deny_consent=deny)

    def connect_authorize_url(
        self,
        *,
        scope: str = "openid profile repo",
        redirect_uri: str | None = None,
        state: str | None = None,
        code_verifier: str,
        **extra: str,
    ) -> str:
        """An authorization URL for connect-app (code flow, PKCE S256, nonce with openid)."""
        challenge = base64.urlsafe_b64encode(hashlib.sha256(code_verifier.encode()).digest())
        params = {
            "response_type": "code",
            "client_id": self.connect_client_id,
            "redirect_uri": redirect_uri or self.connect_redirect_uri,
            "scope": scope,
            "state": state or secrets.token_urlsafe(16),
            "code_challenge": challenge.rstrip(b"=").decode(),
            "code_challenge_method": "S256",
        }
        if "openid" in scope.split():
            params["nonce"] = secrets.token_urlsafe(16)
        params.update(extra)
        return f"{self.metadata()['authorization_endpoint']}?{urlencode(params)}"

    def connect_tokens(
        self, username: str = "alice", *, scope: str = "openid profile repo"
    ) -> dict[str, Any]:
        """Authorize connect-app as ``username`` and redeem the code; the token response.

        What the gateway does when a user connects an account, done here: it
        counts as an ``authorization_code`` call in ``connect_stats()``.
        """
        verifier = secrets.token_urlsafe(48)
        back = self.connect_login(self.connect_authorize_url(scope=scope, code_verifier=verifier),
                                  username)
        query = parse_qs(urlsplit(back).query)
        if "code" not in query:
            raise OidcLoginError(f"no code in the redirect back to connect-app: {back}")
        response = self._connect_post("token_endpoint", {
            "grant_type": "authorization_code", "code": query["code"][0],
            "redirect_uri": self.connect_redirect_uri, "code_verifier": verifier})
        if response.status_code != 200:
            raise OidcLoginError(f"token endpoint: {response.status_code} {response.text[:2000]}")
        tokens: dict[str, Any] = response.json()
        return tokens

    def connect_refresh(self, refresh_token: str, **extra: str) -> requests.Response:
        """Use a refresh token as connect-app (client_secret_basic); the raw answer."""
        return self._connect_post(
            "token_endpoint", {"grant_type": "refresh_token", "refresh_token": refresh_token,
                               **extra})

    def connect_revoke(self, token: str, token_type_hint: str | None = None) -> requests.Response:
        """Revoke a token as connect-app (RFC 7009); the raw answer."""
        data = {"token": token}
        if token_type_hint is not None:
            data["token_type_hint"] = token_type_hint
        return self._connect_post("revocation_endpoint", data)

    def _connect_post(self, endpoint: str, data: dict[str, str]) -> requests.Response:
        return new_session().post(
            self.metadata()[endpoint], data=data,
            auth=(self.connect_client_id, self.connect_client_secret), timeout=HTTP_TIMEOUT,
        )

    # --- logging in ---------------------------------------------------------------

    def login(
        self,
        session: requests.Session | None,
        authorize_url: str,
        username: str | None,
        password: str | None = None,
        *,
        max_steps: int = 10,
        deny_consent: bool = False,
    ) -> str:
        """Sign in at the provider and return the redirect back to the client.

        Starts at ``authorize_url`` (the provider URL the gateway redirected
        to), follows the provider's own redirects, fills in its login form as
        ``username`` and submits a consent form if one is shown. Returns the
        URL of the first redirect that leaves the provider, normally the
        client's redirect URI with ``code``, ``state`` and ``iss`` (or with
        ``error``), without requesting it.

        ``session`` keeps the provider's cookies: pass the same one again to
        find the user still signed in (then pass ``username=None``, as no login
        form is expected). ``None`` uses a fresh session. ``deny_consent``
        cancels at a consent page instead (its "Deny" link: ``access_denied``).
        """
        session = session if session is not None else new_session()
        password = self.password if password is None else password
        url, data = authorize_url, None
        asked_to_log_in = False
        for _ in range(max_steps):
            if data is None:
                response = session.get(url, allow_redirects=False, timeout=HTTP_TIMEOUT)
            else:
                response = session.post(url, data=data, allow_redirects=False, timeout=HTTP_TIMEOUT)
            if response.is_redirect:
                location = urljoin(url, response.headers["Location"])
                if not location.startswith(f"{self.issuer}/"):
                    if username is not None and not asked_to_log_in:
                        raise OidcLoginError(
                            f"the provider did not ask {username!r} to log in: this session "
                            "is signed in already (use a fresh session or prompt=login)"
                        )
                    return location
                url, data = location, None
                continue
            if response.status_code != 200:
                method = response.request.method
                raise OidcLoginError(
                    f"{method} {url}: {response.status_code}\n{response.text[:2000]}"
                )
            page = _parse(response.text)
            forms = page.forms
            if not forms:
                raise OidcLoginError(f"GET {url}: no form on the page\n{response.text[:2000]}")
            form = forms[0]
            if form.id == "consent" and deny_consent:
                url, data = urljoin(url, page.links["abort"]), None
                continue
            if form.id == "login":
                if username is None:
                    raise OidcLoginError("the provider asks for a login, but no username was given")
                asked_to_log_in = True
                data = {**form.fields, "login": username, "password": password}
            else:
                # The consent form, or a form a browser submits by itself (signing
                # the previous account out when another one logs in).
                data = dict(form.fields)
            action = urljoin(url, form.action)
            if not action.startswith(f"{self.issuer}/"):
                raise OidcLoginError(f"GET {url}: a form posts to {action} (form_post?)")
            url = action
        raise OidcLoginError(f"no redirect back to the client after {max_steps} steps")

    def id_token(self, username: str, *, client_id: str = CLIENT_ID) -> str:
        """Sign ``username`` in to a client (authorization code with PKCE); its ID token.

        ``client_id`` is the gateway's client (the default) or ``other_client_id``.
        """
        secret, redirect_uri = {
            self.client_id: (self.client_secret, self.redirect_uri),
            self.other_client_id: (self.other_client_secret, self.other_redirect_uris[0]),
        }[client_id]
        metadata = self.metadata()
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
        query = urlencode({"client_id": client_id, "response_type": "code", "scope": "openid",
                           "redirect_uri": redirect_uri, "state": secrets.token_urlsafe(8),
                           "nonce": secrets.token_urlsafe(8),
                           "code_challenge": challenge.decode().rstrip("="),
                           "code_challenge_method": "S256"})
        back = self.login(new_session(), f"{metadata['authorization_endpoint']}?{query}",
                          username)
        code = parse_qs(urlsplit(back).query)["code"][0]
        answer = new_session().post(metadata["token_endpoint"], timeout=HTTP_TIMEOUT, data={
            "grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri,
            "client_id": client_id, "client_secret": secret, "code_verifier": verifier})
        if answer.status_code != 200:
            raise OidcLoginError(f"token endpoint: {answer.status_code} {answer.text}")
        token: str = answer.json()["id_token"]
        return token

    def logout(self, session: requests.Session, end_session_url: str) -> str | None:
        """Confirm an RP-initiated logout at the provider (its end_session_endpoint).

        Answers "yes" on the provider's confirmation page. Returns the redirect
        back to the client (its post_logout_redirect_uri, with ``state`` if one
        was sent), or None when the provider ends on its own "signed out" page.
        """
        response = session.get(end_session_url, allow_redirects=False, timeout=HTTP_TIMEOUT)
        forms = [form for form in _forms(response.text) if form.id == "op.logoutForm"]
        if response.status_code != 200 or not forms:
            raise OidcLoginError(
                f"GET {end_session_url}: {response.status_code}\n{response.text[:2000]}"
            )
        action = urljoin(end_session_url, forms[0].action)
        response = session.post(
            action, data={**forms[0].fields, "logout": "yes"}, allow_redirects=False,
            timeout=HTTP_TIMEOUT,
        )
        while response.is_redirect:
            location = urljoin(action, response.headers["Location"])
            if not location.startswith(f"{self.issuer}/"):
                return location
            action = location
            response = session.get(location, allow_redirects=False, timeout=HTTP_TIMEOUT)
        if response.status_code != 200:
            raise OidcLoginError(f"logout: {response.status_code}\n{response.text[:2000]}")
        return None


def _read_lines(stream: Any, lines: queue.Queue[str | None]) -> None:
    # Keeps reading, so the provider never blocks on a full stdout pipe.
    for line in stream:
        lines.put(line)
    lines.put(None)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def running_provider(node: str, log_path: Path) -> Iterator[OidcProvider]:
    """oidc-provider under ``node`` on 127.0.0.1 (plain HTTP), logging to ``log_path``.

    Its node modules must be installed (:func:`install_node_modules`). Raises
    RuntimeError when it does not start; stops it afterwards. The test session
    runs one (the ``oidc_provider`` fixture); bench/oauth_callback.py runs its own.
    """
    other_redirect_uris = (OTHER_REDIRECT_URI, f"http://127.0.0.1:{_free_port()}/callback")
    env = {
        **os.environ,
        "OIDC_CLIENT_SECRET": CLIENT_SECRET,
        "OIDC_OTHER_CLIENT_SECRET": OTHER_CLIENT_SECRET,
        "OIDC_OTHER_REDIRECT_URIS": " ".join(other_redirect_uris),
        "OIDC_CONNECT_CLIENT_SECRET": CONNECT_CLIENT_SECRET,
        "OIDC_CONNECT_REDIRECT_URIS": " ".join(CONNECT_REDIRECT_URIS),
        "OIDC_REDIRECT_URIS": " ".join(REDIRECT_URIS),
        "OIDC_POST_LOGOUT_REDIRECT_URIS": " ".join(POST_LOGOUT_REDIRECT_URIS),
        "NO_COLOR": "1",
    }
    env.pop("OIDC_PORT", None)
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [node, "provider.mjs", "0"],
            cwd=OIDC_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    try:
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_read_lines, args=(process.stdout, lines), daemon=True).start()
        try:
            line = lines.get(timeout=START_TIMEOUT)
        except queue.Empty:
            line = None
        if line is None or not line.startswith("READY "):
            raise RuntimeError(
                f"the OpenID Connect provider did not start (stdout: {line!r}):\n"
                + log_path.read_text(errors="replace")
            )
        yield OidcProvider(issuer=line.split()[1], log_path=log_path, process=process,
                           other_redirect_uris=other_redirect_uris)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


@pytest.fixture(scope="session")
def oidc_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcProvider]:
    """oidc-provider on 127.0.0.1 (plain HTTP), running for the whole test session."""
    try:
        node = node_command()
        install_node_modules()
    except NodeUnavailable as error:
        _unavailable(str(error))
    with running_provider(node, tmp_path_factory.mktemp("oidc") / "provider.log") as provider:
        yield provider


@pytest.fixture(scope="session")
def second_oidc_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcProvider]:
    """Another provider like ``oidc_provider``, with an issuer of its own: for tests of two
    providers, one of which may be hostile. Started only for the tests that ask for it."""
    try:
        node = node_command()
        install_node_modules()
    except NodeUnavailable as error:
        _unavailable(str(error))
    with running_provider(node, tmp_path_factory.mktemp("oidc") / "second.log") as provider:
        yield provider


@pytest.fixture(autouse=True)
def _oidc_provider_reset(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used a provider, undo its faults and redirect URIs."""
    yield
    # Which providers the test used is known only now: a test may ask for one
    # while it runs (request.getfixturevalue), and that one is reset too.
    used = [name for name in ("oidc_provider", "second_oidc_provider")
            if name in request.fixturenames]
    providers: list[OidcProvider] = [request.getfixturevalue(name) for name in used]
    for provider in providers:
        if provider.process.poll() is None:
            provider.reset()
