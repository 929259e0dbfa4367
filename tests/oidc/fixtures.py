"""A real OpenID Connect provider on loopback for the gateway's tests.

Load as a plugin (``pytest_plugins = ["tests.oidc.fixtures"]`` in tests/conftest.py)
and ask for the session-scoped ``oidc_provider`` fixture. It runs panva's
oidc-provider (tests/oidc/provider.mjs) under Node.js, installs its node modules
first when they are missing or stale, and stops it at the end of the run. Faults
and redirect URIs a test sets are reset after that test. README.md in this
directory describes the provider, its login pages and its test endpoints.
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
REDIRECT_URIS = ("https://gateway.test/login/callback",)
POST_LOGOUT_REDIRECT_URIS = ("https://gateway.test/",)
ACCOUNTS = ("alice", "bob", "carol")
PASSWORD = "password"
ID_TOKEN_FAULTS = (
    "wrong_audience",
    "wrong_issuer",
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


class OidcLoginError(AssertionError):
    """The provider did not lead the login to a redirect back to the client."""


def node_modules_stamp() -> Path:
    """The file that marks node_modules as installed from the current lockfile.

    ``./dev test`` uses the same name, so either one installing is enough.
    """
    digest = hashlib.sha256(LOCKFILE.read_bytes()).hexdigest()[:16]
    return NODE_MODULES / f".installed-{digest}"


def _unavailable(reason: str) -> NoReturn:
    # A developer without Node.js skips these tests; CI must run them.
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so the OpenID Connect tests must run)", pytrace=False)
    pytest.skip(reason)


def _ensure_node_modules() -> None:
    stamp = node_modules_stamp()
    if stamp.exists():
        return
    npm = shutil.which("npm")
    if npm is None:
        _unavailable("npm is not installed: cannot install tests/oidc/node_modules")
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
        _unavailable(f"npm ci in tests/oidc failed:\n{error.stdout}{error.stderr}")
    except subprocess.TimeoutExpired:
        _unavailable("npm ci in tests/oidc timed out")
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

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {name: value or "" for name, value in attrs}
        if tag == "form":
            self.forms.append(_Form(attributes.get("id", ""), attributes.get("action", ""), {}))
        elif tag == "input" and self.forms and "name" in attributes:
            self.forms[-1].fields[attributes["name"]] = attributes.get("value", "")


def _forms(html: str) -> list[_Form]:
    parser = _FormParser()
    parser.feed(html)
    return parser.forms


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
    _admin: requests.Session = field(default_factory=new_session, repr=False)

    # --- where things are ---------------------------------------------------------

    @property
    def discovery_url(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"

    @property
    def redirect_uri(self) -> str:
        """The gateway client's first redirect URI."""
        return self.redirect_uris[0]

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

    def reset(self) -> None:
        """No faults, and the gateway client's initial redirect URIs."""
        self._post("/__test__/reset", {})
        self.redirect_uris = list(REDIRECT_URIS)
        self.post_logout_redirect_uris = list(POST_LOGOUT_REDIRECT_URIS)

    # --- logging in ---------------------------------------------------------------

    def login(
        self,
        session: requests.Session | None,
        authorize_url: str,
        username: str | None,
        password: str | None = None,
        *,
        max_steps: int = 10,
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
        form is expected). ``None`` uses a fresh session.
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
            forms = _forms(response.text)
            if not forms:
                raise OidcLoginError(f"GET {url}: no form on the page\n{response.text[:2000]}")
            form = forms[0]
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


@pytest.fixture(scope="session")
def oidc_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcProvider]:
    """oidc-provider on 127.0.0.1 (plain HTTP), running for the whole test session."""
    node = shutil.which("node")
    if node is None:
        _unavailable("Node.js (node) is not installed: the OpenID Connect provider cannot run")
    _ensure_node_modules()

    log_path = tmp_path_factory.mktemp("oidc") / "provider.log"
    other_redirect_uris = (OTHER_REDIRECT_URI, f"http://127.0.0.1:{_free_port()}/callback")
    env = {
        **os.environ,
        "OIDC_CLIENT_SECRET": CLIENT_SECRET,
        "OIDC_OTHER_CLIENT_SECRET": OTHER_CLIENT_SECRET,
        "OIDC_OTHER_REDIRECT_URIS": " ".join(other_redirect_uris),
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


@pytest.fixture(autouse=True)
def _oidc_provider_reset(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used the provider, undo its faults and redirect URIs."""
    if "oidc_provider" not in request.fixturenames:
        yield
        return
    provider: OidcProvider = request.getfixturevalue("oidc_provider")
    yield
    if provider.process.poll() is None:
        provider.reset()
