"""The JSON API's edge: ``/api/v1``, bearer authentication, rate limits, JSON bodies.

Every route under it requires a client's API token unless marked
:func:`public` (the OpenAPI document), so a route cannot forget to check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final, TypeVar

from flask import Blueprint, Flask, current_app, g, request
from pydantic import TypeAdapter, ValidationError
from sqlalchemy import Executable, RowMapping

from gateway import db
from gateway.clients.models import ClientIdentity
from gateway.clients.service import authenticate, authenticate_joined
from gateway.errors import GatewayError, InvalidInput
from gateway.settings import Settings
from gateway.web import ratelimit

PREFIX: Final = "/api/v1"
View = TypeVar("View", bound=Callable[..., object])
_PUBLIC_ATTRIBUTE: Final = "_public_api"
_JOINED_ATTRIBUTE: Final = "_token_joined"
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


def token_joined(statement: Executable) -> Callable[[View], View]:
    """Run a route's token check as ``statement``, joined with the row the route reads.

    ``statement`` comes from :func:`gateway.clients.service.token_check_joined`;
    its parameters are the route's path parameters, by name. The view takes
    the row from :func:`joined_row`: one statement for the check and the read.
    """
    def mark(view: View) -> View:
        setattr(view, _JOINED_ATTRIBUTE, statement)
        return view
    return mark


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


def joined_row() -> RowMapping:
    """The row a :func:`token_joined` route's token check read with it."""
    row: RowMapping = g.joined_row
    return row


def _authenticate() -> None:
    # Every value of a repeated name: the first alone would let ?x=a&x=gw_… through.
    if any(name.lower() in _TOKEN_PARAMETERS or value.startswith("gw_")
           for name, value in request.args.items(multi=True)):
        raise TokenInQuery()
    view = current_app.view_functions.get(request.endpoint or "")
    if getattr(view, _PUBLIC_ATTRIBUTE, False):
        return
    # The request's first statement: in a request that writes, its
    # transaction begins here, as one that writes (see gateway.db).
    connection = db.session().connection()
    joined: Executable | None = getattr(view, _JOINED_ATTRIBUTE, None)
    if joined is None:
        g.client = authenticate(connection, ratelimit.token_digest())
        return
    g.client, g.joined_row = authenticate_joined(connection, ratelimit.token_digest(), joined,
                                                 request.view_args or {})


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


def query_cursor() -> str | None:
    """The ``cursor`` query parameter; empty asks for the first page, as absent does.

    Clients that build the URL from the last next_cursor they kept send
    ``cursor=`` for the first page, and the OpenAPI document allows it.
    """
    return request.args.get("cursor") or None


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


_KIND_TAGS: Final = frozenset({"api_key", "oauth", "payment"})


def _is_model_name(part: object) -> bool:
    # For a union, pydantic names the member it tried ("AmountPayment"); the
    # caller knows field paths, not our class names. Fields are lower case.
    return isinstance(part, str) and part[:1].isupper()
