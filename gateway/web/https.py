"""HTTPS only, and only for the configured host names.

A portal page asked for over plain HTTP (GET or HEAD) is redirected (301) to
the public https origin. An API request over plain HTTP is refused, never
redirected: a redirect would teach a misconfigured client that http works,
and the token it sent in the clear is exposed already. A form posted to a
page over plain HTTP is refused too: a 301 or 303 would drop its body (the
browser follows with a GET), a 307 or 308 would send again over https what
already crossed the network in the clear; the answer says so instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

from flask import Flask, current_app, redirect, request
from werkzeug.exceptions import SecurityError
from werkzeug.sansio.utils import host_is_trusted
from werkzeug.wrappers import Response

from gateway.errors import GatewayError
from gateway.settings import Settings
from gateway.web.errors import HttpsRequired, is_api_request

View = TypeVar("View", bound=Callable[..., object])
_PLAIN_HTTP_ATTRIBUTE: Final = "_allows_plain_http"


def allow_plain_http(view: View) -> View:
    """Opt a view out of the HTTPS and host rules (health probes that carry no data).

    Load balancers probe backends directly, by address and over plain HTTP.
    """
    setattr(view, _PLAIN_HTTP_ATTRIBUTE, True)
    return view


def allows_plain_http(view: object) -> bool:
    """Whether ``view`` opted out of the HTTPS and host rules."""
    return bool(getattr(view, _PLAIN_HTTP_ATTRIBUTE, False))


def init_app(app: Flask) -> None:
    """Enforce host and scheme on every request (as gateway.web.proxies reports them)."""
    # The host rule is checked in _enforce_https, not by Flask's
    # TRUSTED_HOSTS: that compares case-sensitively (a Host of LOCALHOST
    # was refused) and runs before routing, so no route could opt out.
    app.before_request(_enforce_https)
    app.before_request(_refuse_cross_site_forms)


class FormOverPlainHttp(GatewayError):
    status = 403
    code = "https-required"
    title = "HTTPS required"

    def __init__(self) -> None:
        super().__init__(
            "This form came over plain HTTP and was not processed. Open the page again at "
            "its https:// address and send it from there. What it held crossed the network "
            "unencrypted: if that was a key, revoke it where it was issued.")


class CrossSiteRequest(GatewayError):
    status = 403
    code = "cross-site-request"
    title = "Refused a request from another site"


# Methods that change nothing; anything else on a page must come from a page of ours.
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _refuse_cross_site_forms() -> None:
    # Fetch metadata (Sec-Fetch-Site) is set by the browser and cannot be
    # forged by a page; it refuses cross-site form posts before the CSRF
    # token is even looked at. The API is exempt: its callers are servers.
    if request.method in _SAFE_METHODS or is_api_request():
        return
    if request.headers.get("Sec-Fetch-Site", "same-origin") in ("cross-site", "same-site"):
        raise CrossSiteRequest("This form was sent from another site, so it was refused. "
                               "Open the page on this site and try again.")


def _enforce_https() -> Response | None:
    view = current_app.view_functions.get(request.endpoint or "")
    if allows_plain_http(view):
        return None
    _check_host()
    if request.scheme == "https":
        return None
    if is_api_request():
        raise HttpsRequired()
    if request.method not in _SAFE_METHODS:
        raise FormOverPlainHttp()
    settings: Settings = current_app.extensions["gateway.settings"]
    target = settings.public_url + request.full_path.rstrip("?")
    return redirect(target, code=301)


def _check_host() -> None:
    # A Host outside the configured names answers 400: that stops DNS
    # rebinding and absolute URLs built from a poisoned Host. Host names are
    # case-insensitive (RFC 9110, section 4.2.3), so the comparison is too.
    settings: Settings = current_app.extensions["gateway.settings"]
    trusted = [host.lower() for host in settings.trusted_hosts]
    if not host_is_trusted(request.host.lower(), trusted):
        raise SecurityError("This site does not answer to that host name.")
