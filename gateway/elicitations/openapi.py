"""The elicitation routes in the OpenAPI document."""

from __future__ import annotations

from gateway.elicitations.api import MAX_WAIT_SECONDS
from gateway.elicitations.service import MAX_PAGE
from gateway.web.openapi import (
    Document,
    cursor_query,
    json_answer,
    problem_responses,
    query,
    subject_filters,
)


def describe(document: Document, *, api_key_types: list[str], oauth_types: list[str],
             payments_enabled: bool) -> None:
    """Add the elicitation routes and schemas to ``document``."""
    from gateway.elicitations.schemas import (
        ELICITATION_ID,
        CreateElicitation,
        ElicitationPage,
        ElicitationView,
    )

    create = document.schema("CreateElicitation", CreateElicitation)
    _narrow_create(document, api_key_types, oauth_types, payments_enabled)
    view = document.schema("Elicitation", ElicitationView)
    page = document.schema("ElicitationPage", ElicitationPage)
    elicitation_id = {"name": "elicitation_id", "in": "path", "required": True,
                      "schema": {"type": "string", "pattern": ELICITATION_ID}}
    document.path("/api/v1/elicitations", "post", {
        "operationId": "createElicitation",
        "summary": "Create an elicitation for one of the client's users",
        "parameters": [{
            "name": "Idempotency-Key", "in": "header", "required": False,
            "description": "Retries with the same key and body get the first answer",
            "schema": {"type": "string", "pattern": "^[\\x21-\\x7e]{1,255}$"},
        }],
        "requestBody": {"required": True, "content": {"application/json": {"schema": create}}},
        "responses": {
            "201": json_answer("Created", view, location=True),
            "200": json_answer("A still-open elicitation for the same user and purpose, "
                               "reused", view),
            **problem_responses(400, 401, 409, 413, 415, 422, 429),
        },
    })
    document.path("/api/v1/elicitations", "get", {
        "operationId": "listElicitations",
        "summary": "The client's elicitations, newest first",
        "parameters": [
            query("status", {"type": "string", "enum": list(ElicitationView.model_fields[
                "status"].annotation.__args__)}),  # type: ignore[union-attr]
            query("kind", {"type": "string", "enum": ["api_key", "oauth", "payment"]}),
            *subject_filters(),
            cursor_query(),
            query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE}),
        ],
        "responses": {"200": json_answer("One page", page),
                      **problem_responses(400, 401, 422, 429)},
    })
    document.path("/api/v1/elicitations/{elicitation_id}", "get", {
        "operationId": "getElicitation",
        "summary": "One elicitation; ?wait=N holds the answer until it ends or N seconds pass",
        "parameters": [elicitation_id, query("wait", {
            "type": "integer", "minimum": 0, "maximum": MAX_WAIT_SECONDS})],
        "responses": {"200": json_answer("The elicitation", view),
                      **problem_responses(400, 401, 404, 422, 429)},
    })
    document.path("/api/v1/elicitations/{elicitation_id}/cancel", "post", {
        "operationId": "cancelElicitation",
        "summary": "Cancel an open elicitation; its link stops working",
        "parameters": [elicitation_id],
        "responses": {"200": json_answer("Cancelled", view),
                      **problem_responses(400, 401, 404, 409, 429)},
    })


def _narrow_create(document: Document, api_key_types: list[str], oauth_types: list[str],
                   payments_enabled: bool) -> None:
    # The document describes this deployment: only its credential types,
    # OAuth connections only where the catalog has a type for them, and
    # payments only where Stripe is configured.
    schemas = document.components["schemas"]
    schemas["CreateApiKeyElicitation"]["properties"]["credential_type"]["enum"] = api_key_types
    schemas["CreateOAuthElicitation"]["properties"]["credential_type"]["enum"] = oauth_types
    create = schemas["CreateElicitation"]
    for kind, schema, offered in (("oauth", "CreateOAuthElicitation", bool(oauth_types)),
                                  ("payment", "CreatePaymentElicitation", payments_enabled)):
        if not offered:
            create["oneOf"] = [option for option in create["oneOf"]
                               if option["$ref"] != f"#/components/schemas/{schema}"]
            create["discriminator"]["mapping"].pop(kind, None)
