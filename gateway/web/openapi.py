"""The OpenAPI 3.1 document at ``/api/v1/openapi.json``.

Built from the same pydantic models that validate requests, so the document
and the checks cannot drift apart. It describes this deployment: its
credential types, and payments only where Stripe is configured.
"""

from __future__ import annotations

from typing import Any, Final

from flask import Blueprint, Response, current_app, jsonify
from pydantic import TypeAdapter

from gateway import __version__
from gateway.clients.service import API_TOKEN_PREFIX
from gateway.settings import Settings
from gateway.web.api import public

blueprint = Blueprint("openapi", __name__)
EXTENSION: Final = "gateway.openapi"
REF: Final = "#/components/schemas/{model}"

_PROBLEM_TITLES: Final = {
    400: "The request is malformed", 401: "No valid API token",
    404: "No such resource for this client", 409: "Conflicts with the current state",
    413: "The body is over 64 KiB", 415: "The body is not JSON",
    422: "The request breaks a rule", 429: "Rate limit reached; see Retry-After",
    503: "The database is unavailable for now; see Retry-After",
}


class Document:
    """An OpenAPI document under construction."""

    def __init__(self, title: str, version: str) -> None:
        self.paths: dict[str, dict[str, Any]] = {}
        self.components: dict[str, dict[str, Any]] = {
            "schemas": {"Problem": _PROBLEM_SCHEMA},
            "securitySchemes": {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "The client's API token (gw_…) from `gateway clients create`",
            }},
        }
        self.info = {"title": title, "version": version}

    def schema(self, name: str, annotation: Any) -> dict[str, Any]:
        """Register a model's JSON schema; a reference to it."""
        generated = TypeAdapter(annotation).json_schema(ref_template=REF)
        self.components["schemas"].update(generated.pop("$defs", {}))
        self.components["schemas"][name] = generated
        return {"$ref": REF.format(model=name)}

    def path(self, path: str, method: str, operation: dict[str, Any]) -> None:
        """Add one operation: it needs the bearer token (and may answer 503) unless it says not."""
        operation.setdefault("security", [{"bearer": []}])
        if operation["security"]:
            # Its token is checked in the database: while that is away, 503
            # (an operation may say what else its 503 can mean).
            responses = operation["responses"]
            operation["responses"] = {**responses, "503": responses.get(
                "503", problem_responses(503)["503"])}
        self.paths.setdefault(path, {})[method] = operation

    def as_json(self) -> dict[str, Any]:
        return {"openapi": "3.1.0", "info": self.info, "paths": self.paths,
                "components": self.components}


def problem_responses(*statuses: int) -> dict[str, Any]:
    """Problem+json answers for these statuses."""
    return {str(status): {
        "description": _PROBLEM_TITLES[status],
        "content": {"application/problem+json": {
            "schema": {"$ref": REF.format(model="Problem")}}},
    } for status in statuses}


def json_answer(description: str, schema: dict[str, Any], *,
                location: bool = False) -> dict[str, Any]:
    """A JSON answer with this schema (and a Location header for creations)."""
    answer: dict[str, Any] = {"description": description,
                              "content": {"application/json": {"schema": schema}}}
    if location:
        answer["headers"] = {"Location": {"schema": {"type": "string"}}}
    return answer


def query(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """An optional query parameter."""
    return {"name": name, "in": "query", "required": False, "schema": schema}


# The OpenAPI format of paging cursors: a next_cursor the API returned.
CURSOR_FORMAT: Final = "cursor"


def cursor_query() -> dict[str, Any]:
    """``cursor``: opaque, only a next_cursor this API returned; empty, as absent, is page one."""
    return query("cursor", {"type": "string", "format": CURSOR_FORMAT,
                            "description": "the next_cursor of the page before; absent or "
                                           "empty for the first page"})


def subject_filters() -> list[dict[str, Any]]:
    """``subject_iss`` and ``subject_sub``, under the rules of a subject in a body."""
    from gateway.elicitations.schemas import Issuer, SubjectId

    return [query("subject_iss", _untokenlike(TypeAdapter(Issuer).json_schema())),
            query("subject_sub", _untokenlike(TypeAdapter(SubjectId).json_schema()))]


def _untokenlike(schema: dict[str, Any]) -> dict[str, Any]:
    # The API refuses (400) any query value that starts like an API token:
    # tokens must never travel in URLs, where proxies and logs keep them.
    return {**schema, "not": {"pattern": f"^{API_TOKEN_PREFIX}"},
            "description": f"A value starting with {API_TOKEN_PREFIX} is refused as a "
                           "token in the URL"}


_PROBLEM_SCHEMA: Final = {
    "type": "object",
    "description": "RFC 9457 problem details",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "request_id": {"type": "string"},
    },
}


def build(settings: Settings) -> dict[str, Any]:
    """The whole document for this deployment."""
    from gateway.credentials import openapi as credentials
    from gateway.credentials.catalog import current_catalog
    from gateway.elicitations import openapi as elicitations

    document = Document("Gateway API", __version__)
    catalog = current_catalog()
    elicitations.describe(document, api_key_types=catalog.ids_of("api_key"),
                          oauth_types=catalog.ids_of("oauth"),
                          payments_enabled=settings.stripe_secret_key is not None)
    credentials.describe(document, credential_types=catalog.ids)
    document.path("/api/v1/openapi.json", "get", {
        "operationId": "openapi", "summary": "This document", "security": [],
        "responses": {"200": {"description": "OpenAPI 3.1",
                              "content": {"application/json": {"schema": {"type": "object"}}}},
                      **problem_responses(400, 429)},
    })
    return document.as_json()


@blueprint.get("/openapi.json")
@public  # describes the API; holds nothing private
def openapi() -> Response:
    """The OpenAPI document of this gateway's API."""
    document = current_app.extensions.get(EXTENSION)
    if document is None:
        document = build(current_app.extensions["gateway.settings"])
        current_app.extensions[EXTENSION] = document
    return jsonify(document)
