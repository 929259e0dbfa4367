"""The credentials routes in the OpenAPI document."""

from __future__ import annotations

from typing import Any

from gateway.credentials.api import MAX_PAGE
from gateway.credentials.schemas import (
    CREDENTIAL_ID,
    CredentialPage,
    CredentialView,
    RevealedCredential,
)
from gateway.web.openapi import (
    Document,
    cursor_query,
    json_answer,
    problem_responses,
    query,
    subject_filters,
)


def describe(document: Document, *, credential_types: list[str]) -> None:
    """Add the credentials routes and schemas to ``document``."""
    view = document.schema("Credential", CredentialView)
    page = document.schema("CredentialPage", CredentialPage)
    revealed = document.schema("RevealedCredential", RevealedCredential)
    credential_id: dict[str, Any] = {"name": "credential_id", "in": "path", "required": True,
                                     "schema": {"type": "string", "pattern": CREDENTIAL_ID}}
    document.path("/api/v1/credentials", "get", {
        "operationId": "listCredentials",
        "summary": "Metadata of the client's stored credentials, newest first",
        "parameters": [
            *subject_filters(),
            query("type", {"type": "string", "enum": credential_types}),
            query("status", {"type": "string", "enum": ["active", "all"],
                             "description": "all: revoked ones too"}),
            cursor_query(),
            query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE}),
        ],
        "responses": {"200": json_answer("One page", page),
                      **problem_responses(400, 401, 422, 429)},
    })
    problems = problem_responses(400, 401, 404, 409, 429, 503)
    problems["409"]["description"] = ("Revoked; or reconnect-required: the provider refused to "
                                      "refresh the connection, its user must connect again")
    problems["503"]["description"] = ("The database, or the provider of a connection whose "
                                      "token had to be refreshed, is unavailable for now; see "
                                      "Retry-After")
    document.path("/api/v1/credentials/{credential_id}/reveal", "post", {
        "operationId": "revealCredential",
        "summary": "The plaintext key, or a connection's working access token, for the MCP "
                   "server that asked for it (audited)",
        "parameters": [credential_id],
        "responses": {"200": json_answer("The key, or the connection's access token", revealed),
                      **problems},
    })
    document.path("/api/v1/credentials/{credential_id}", "delete", {
        "operationId": "revokeCredential",
        "summary": "Revoke a credential; it can no longer be revealed",
        "parameters": [credential_id],
        "responses": {"200": json_answer("Revoked", view),
                      **problem_responses(400, 401, 404, 409, 429)},
    })
