"""The subject of the browser's session, and sending a visitor to log in."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast
from urllib.parse import urlencode, urlsplit

from flask import current_app, redirect, request, session, url_for
from werkzeug.wrappers import Response

from gateway.identity.lockout import Lockout
from gateway.identity.sessions import ServerSession, Subject
from gateway.settings import Secret
from gateway.tokens import keyed_digest

SAFE_FALLBACK = "/"
LOCKOUT_EXTENSION = "gateway.login_lockout"


def current_lockout() -> Lockout:
    """The login lockout of the app handling this request, built once in ``create_app``."""
    lockout: Lockout = current_app.extensions[LOCKOUT_EXTENSION]
    return lockout


def current_subject() -> Subject | None:
    """Who this browser's session belongs to, if anyone has logged in."""
    # Flask's session proxy answers isinstance for the session it stands for.
    return session.subject if isinstance(session, ServerSession) else None


def browser_binding(pepper: Secret) -> str | None:
    """The keyed digest of this browser's session id, to bind something to this browser.

    None for a browser without a stored session. The id changes at every
    login, so a binding made before a login does not hold after it.
    """
    token = session.token if isinstance(session, ServerSession) else None
    return keyed_digest(pepper, token) if token else None


def page_subject() -> Subject | None:
    """Who a page is shown to, for its account links; None where the session never opened.

    An error page can be rendered for a request whose session could not be
    read (the database was away while the request was set up); Flask's
    session proxy then fails an assertion instead of answering.
    """
    try:
        return current_subject()
    except AssertionError:
        return None


def actor_of(subject: Subject) -> str:
    """The audit trail's name for a signed-in user."""
    return f"user:{subject.sub}@{subject.iss}"


def log_in(subject: Subject) -> None:
    """Bind the session to ``subject`` under a new id (the old one stops working)."""
    _server_session().log_in(subject)


def log_out() -> None:
    """End the session: its row is deleted, its cookie removed."""
    _server_session().end()


def _server_session() -> ServerSession:
    assert isinstance(session, ServerSession), "the server-side session interface is not set"
    return session


def login_redirect(next_path: str) -> Response:
    """Send the visitor to log in, and back to ``next_path`` afterwards."""
    return redirect(url_for("identity.login") + "?" + urlencode({"next": safe_next(next_path)}))


def safe_next(candidate: str | None) -> str:
    """A path on this site to return to after login; anything else becomes ``/``.

    Refuses what a browser could read as another site: absolute URLs
    (``https:evil``), scheme-relative ones (``//evil``, ``/\\evil``, which
    browsers treat like ``//``), userinfo tricks, and control characters or
    whitespace, which browsers strip before parsing (``/\\t/evil``).
    """
    if not candidate or not candidate.startswith("/"):
        return SAFE_FALLBACK
    if candidate.startswith("//") or "\\" in candidate:
        return SAFE_FALLBACK
    if any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in candidate):
        return SAFE_FALLBACK
    parts = urlsplit(candidate)
    if parts.scheme or parts.netloc:
        return SAFE_FALLBACK
    return candidate


View = TypeVar("View", bound=Callable[..., Any])


def signed_in(back: str | None = None) -> Callable[[View], View]:
    """Run the view for a signed-in user, passed as ``subject``; send anyone else to log in.

    After the login a GET comes back to where it was. A POST cannot be
    replayed, so it comes back to ``back`` (formatted with the route's
    variables, e.g. ``"/e/{elicitation_id}"``), the page its form was on.
    """

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def checked(**arguments: Any) -> Any:
            subject = current_subject()
            if subject is None:
                if request.method == "GET" or back is None:
                    return login_redirect(request.full_path.rstrip("?"))
                return login_redirect(back.format(**arguments))
            return view(subject=subject, **arguments)

        return cast(View, checked)

    return decorate
