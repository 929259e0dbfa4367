"""Security headers, defined once as data.

The Content-Security-Policy starts from ``default-src 'none'`` and opens only
what the portal's pages use; every opening is commented with its reason. A
view that needs more (the Stripe checkout page posts to Stripe) says so with
:func:`csp_allow`, so every exception can be found with grep.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from flask import Flask, Response, current_app, g, request

from gateway.settings import Settings

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

NONCE: Final = "{nonce}"

CSP: Final[dict[str, tuple[str, ...]]] = {
    # Nothing loads unless a directive below allows it.
    "default-src": ("'none'",),
    # Scripts only when the page marks them with this response's nonce:
    # no inline handlers, no injected <script>. A response whose template
    # asked for no nonce (JSON, most pages) gets 'none' here instead.
    "script-src": (f"'nonce-{NONCE}'",),
    # Our own stylesheet; no inline style, so injected markup cannot restyle
    # the page into a phishing form.
    "style-src": ("'self'",),
    # Our own images (logo, icons); no remote pixels that could track users.
    "img-src": ("'self'",),
    # Forms post back to the gateway only.
    "form-action": ("'self'",),
    # No page of ours may be framed: stops clickjacking of the submit button.
    "frame-ancestors": ("'none'",),
    # A <base> tag could re-point every relative link and form.
    "base-uri": ("'none'",),
    # No plugins.
    "object-src": ("'none'",),
}

STATIC_HEADERS: Final[dict[str, str]] = {
    # One year, subdomains too: after the first visit a browser never tries http.
    "Strict-Transport-Security": "max-age=31536000; includeSubDomains",
    "X-Content-Type-Options": "nosniff",
    # Elicitation URLs carry ids; no other site learns them from a Referer.
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=()",
}

# Pages and API answers may hold personal data or secrets: never cached.
NO_STORE: Final = "no-store"
# Static files hold nothing private; caching them keeps pages fast.
STATIC_CACHE: Final = "public, max-age=3600"

View = TypeVar("View", bound=Callable[..., object])
_EXTRA_ATTRIBUTE: Final = "_csp_extra"


def csp_allow(directive: str, *sources: str) -> Callable[[View], View]:
    """Let one view's responses load or post to ``sources`` under ``directive``."""
    if directive not in CSP:
        raise ValueError(f"unknown CSP directive {directive!r}")

    def mark(view: View) -> View:
        extra: dict[str, tuple[str, ...]] = dict(getattr(view, _EXTRA_ATTRIBUTE, {}))
        extra[directive] = (*extra.get(directive, ()), *sources)
        setattr(view, _EXTRA_ATTRIBUTE, extra)
        return view

    return mark


def csp_allow_here(directive: str, *sources: str) -> None:
    """Let the current response alone load or post to ``sources`` under ``directive``.

    For a view that renders several kinds of page, where only one kind needs
    the opening (the elicitation page posts toward Stripe only for a payment).
    """
    if directive not in CSP:
        raise ValueError(f"unknown CSP directive {directive!r}")
    extra: dict[str, tuple[str, ...]] = g.setdefault(_EXTRA_ATTRIBUTE, {})
    extra[directive] = (*extra.get(directive, ()), *sources)


def build_csp(nonce: str | None, extra: dict[str, tuple[str, ...]] | None = None) -> str:
    """The policy text for one response; without a nonce, no nonce source at all."""
    parts = []
    for directive, sources in CSP.items():
        values = [*sources, *(extra or {}).get(directive, ())]
        if nonce is None:
            values = [value for value in values if NONCE not in value] or ["'none'"]
        parts.append(" ".join((directive, *values)).replace(NONCE, nonce or ""))
    return "; ".join(parts)


def csp_nonce() -> str:
    """This response's script nonce (templates use it as ``csp_nonce()``)."""
    if "csp_nonce" not in g:
        g.csp_nonce = secrets.token_urlsafe(18)
    nonce: str = g.csp_nonce
    return nonce


def init_app(app: Flask, settings: Settings) -> None:
    """Add the headers to every response."""
    app.wsgi_app = StaticHeaders(app.wsgi_app)  # type: ignore[method-assign]
    app.after_request(_add_headers)
    app.jinja_env.globals["csp_nonce"] = csp_nonce


class StaticHeaders:
    """WSGI middleware adding :data:`STATIC_HEADERS` to every response as it starts.

    Added to the plain list of the WSGI call, not one by one to the Flask
    response, whose header map scans all its headers for each one set (this
    halved the time the headers took on an API answer). It also covers
    responses no ``after_request`` hook sees. A header a view set itself is
    left as the view set it.
    """

    def __init__(self, app: WSGIApplication) -> None:
        self._app = app

    def __call__(self, environ: WSGIEnvironment,
                 start_response: StartResponse) -> Iterable[bytes]:
        def start(status: str, headers: list[tuple[str, str]],
                  exc_info: Any = None) -> Callable[[bytes], object]:
            present = {name.lower() for name, _ in headers}
            headers.extend(item for item in _STATIC_HEADER_LIST
                           if item[0].lower() not in present)
            return start_response(status, headers, exc_info)

        return self._app(environ, start)


_STATIC_HEADER_LIST: Final = tuple(STATIC_HEADERS.items())


def _add_headers(response: Response) -> Response:
    view = current_app.view_functions.get(request.endpoint or "")
    extra: dict[str, tuple[str, ...]] = getattr(view, _EXTRA_ATTRIBUTE, {})
    if _EXTRA_ATTRIBUTE in g:
        extra = dict(extra)
        for directive, sources in g.get(_EXTRA_ATTRIBUTE, {}).items():
            extra[directive] = (*extra.get(directive, ()), *sources)
    # A nonce only when the response's template asked for one: an answer
    # without a page (JSON, redirects) allows no script at all.
    nonce = g.get("csp_nonce")
    headers = response.headers
    headers["Content-Security-Policy"] = _csp_for(nonce, extra)
    is_static = request.endpoint == "static" and response.status_code < 400
    headers["Cache-Control"] = STATIC_CACHE if is_static else NO_STORE
    if not is_static:
        headers["Pragma"] = "no-cache"
    return response


def _csp_for(nonce: str | None, extra: dict[str, tuple[str, ...]]) -> str:
    # Every response gets a policy; most get the plain one, so its text is
    # built once and only the nonce is put in per response.
    if extra:
        return build_csp(nonce, extra)
    if nonce is None:
        return _NO_SCRIPT_CSP
    return _PLAIN_CSP_HEAD + nonce + _PLAIN_CSP_TAIL


_PLAIN_CSP_HEAD, _PLAIN_CSP_TAIL = build_csp(NONCE).split(NONCE)
_NO_SCRIPT_CSP: Final = build_csp(None)
