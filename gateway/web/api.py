"""The JSON API's edge: ``/api/v1``, bearer authentication, rate limits, JSON bodies.

Every route under it requires a client's API token unless marked
:func:`public` (the OpenAPI document), so a route cannot forget to check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final, TypeVar

from flask import Blueprint, Flask, current_app, g, request
from pydantic import TypeAdapter, ValidationError
from sqlalchemy import Connection

from gateway import db
from gateway.clients.models import ClientIdentity
from gateway.clients.service import OwnedLookup, authenticate
from gateway.errors import GatewayError, InvalidInput
from gateway.settings import Settings
from gateway.web import ratelimit

PREFIX: Final = "/api/v1"
View = TypeVar("View", bound=Callable[..., object])
_PUBLIC_ATTRIBUTE: Final = "_public_api"
_AUTOCOMMIT_ATTRIBUTE: Final = "_autocommit_api"
_LOOKUP_ATTRIBUTE: Final = "_api_lookup"
# Query parameters that, by convention, carry tokens (RFC 6750 section 2.3).
_TOKEN_PARAMETERS: Final = frozenset({"access_token", "token", "api_token", "api_key"})
T = TypeVar("T")


class TokenInQuery(GatewayError):
    status = 400
    code = "token-in-query"
    title = "Token in the query string"

    def __init__(self) -> None:
        super().__init__("API tokens go in the Authorization header, never in the URL, where "
                         "proxies and logs keep them. Nothing was processed; rotate the token.")


class InvalidJson(GatewayError):
    status = 400
    code = "invalid-json"
    title = "Invalid JSON"


class UnsupportedMediaType(GatewayError):
    status = 415
    code = "unsupported-media-type"
    title = "Unsupported media type"


class ValidationFailed(GatewayError):
    status = 422
    code = "validation-failed"
    title = "The request body is not valid"


def public(view: View) -> View:
    """Opt a route out of authentication (documents with nothing private in them)."""
    setattr(view, _PUBLIC_ATTRIBUTE, True)
    return view


def autocommit(view: View) -> View:
    """Mark a change that runs outside any transaction, as one statement.

    Its token is then checked on the autocommit connection too, so the
    request opens no transaction at all (see :func:`gateway.db.autocommit`).
    """
    setattr(view, _AUTOCOMMIT_ATTRIBUTE, True)
    return view


def looks_up(lookup: OwnedLookup, **parameters: str) -> Callable[[View], View]:
    """Read the view's row in the token check's own statement (see :class:`OwnedLookup`).

    ``parameters`` name, for each of the look-up's parameters, the route's
    variable that gives its value: ``@looks_up(OWN_ROW, id="row_id")``. The
    view gets the row from :func:`looked_up`.
    """

    def mark(view: View) -> View:
        setattr(view, _LOOKUP_ATTRIBUTE, (lookup, parameters))
        return view

    return mark


def looked_up() -> Any | None:
    """The row the view's :func:`looks_up` found: None if there is none, or another client's."""
    return g.looked_up


def init_app(app: Flask, settings: Settings, children: Iterable[Blueprint]) -> None:
    """Mount the feature blueprints under /api/v1 behind authentication and limits."""
    parent = Blueprint("api", __name__, url_prefix=PREFIX)
    # Limits first: a request with a wrong token still counts against its address.
    ratelimit.limit_api(app, parent, settings)
    parent.before_request(_authenticate)
    csrf = app.extensions["csrf"]
    for child in children:
        parent.register_blueprint(child)
        # CSRF rides on credentials a browser sends by itself (cookies). The
        # API takes only a bearer token, which no other site can make a
        # browser send, so its routes carry no CSRF token.
        csrf.exempt(child)
    app.register_blueprint(parent)


def current_client() -> ClientIdentity:
    """The client that authenticated this request."""
    client: ClientIdentity = g.client
    return client


def _authenticate() -> None:
    if any(name.lower() in _TOKEN_PARAMETERS for name in request.args) or any(
        value.startswith("gw_") for value in request.args.values()
    ):
        raise TokenInQuery()
    view = current_app.view_functions.get(request.endpoint or "")
    if getattr(view, _PUBLIC_ATTRIBUTE, False):
        return
    connection = _connection_for(view)
    lookup = getattr(view, _LOOKUP_ATTRIBUTE, None)
    if lookup is None:
        g.client = authenticate(connection, ratelimit.token_digest())
        return
    statement, parameters = lookup
    arguments = request.view_args or {}
    g.client, g.looked_up = statement.run(connection, ratelimit.token_digest(), {
        name: arguments[variable] for name, variable in parameters.items()})


# Methods whose routes only read.
_READS: Final = frozenset({"GET", "HEAD", "OPTIONS"})


def _connection_for(view: object) -> Connection:
    # A read, or a change marked autocommit, checks the token on the
    # autocommit connection (no transaction); any other change checks it on
    # the connection its transaction will use, so the request takes one
    # connection from the pool, not two.
    if request.method in _READS or getattr(view, _AUTOCOMMIT_ATTRIBUTE, False):
        return db.autocommit()
    return db.session().connection()


def json_body(adapter: TypeAdapter[T]) -> T:
    """The request's JSON body, validated; a problem naming each bad field otherwise."""
    if not request.is_json:
        raise UnsupportedMediaType("send the body as JSON with Content-Type: application/json")
    raw = request.get_data(cache=True)
    try:
        return adapter.validate_json(raw)
    except ValidationError as error:
        problems = [_describe(item) for item in error.errors(include_url=False)]
        if any(item["type"] == "json_invalid" for item in error.errors(include_url=False)):
            raise InvalidJson("the body is not valid JSON") from None
        raise ValidationFailed("; ".join(f"{p['field']}: {p['problem']}" for p in problems),
                               errors=problems) from None


def query_text(name: str, adapter: TypeAdapter[str]) -> str | None:
    """A query parameter checked by the same rules as the body field it filters on."""
    value = request.args.get(name)
    if value is None:
        return None
    try:
        return adapter.validate_python(value)
    except ValidationError as error:
        raise InvalidInput(f"{name}: {error.errors(include_url=False)[0]['msg']}",
                           field=name) from None


def _describe(item: Any) -> dict[str, str]:
    parts = list(item["loc"])
    if parts and parts[0] in _KIND_TAGS:
        parts = parts[1:]  # the discriminator value pydantic tried, not a field
    location = ".".join(str(part) for part in parts if not _is_model_name(part))
    problem = item["msg"]
    if item["type"] == "extra_forbidden":
        problem = "unknown field"
    elif item["type"] == "missing":
        problem = "required"
    return {"field": location or "body", "problem": problem}


_KIND_TAGS: Final = frozenset({"api_key", "payment"})


def _is_model_name(part: object) -> bool:
    # For a union, pydantic names the member it tried ("AmountPayment"); the
    # caller knows field paths, not our class names. Fields are lower case.
    return isinstance(part, str) and part[:1].isupper()
