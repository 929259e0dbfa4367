"""Asking for a connection through the API: the type's kind, its scopes, reuse."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.settings import Settings
from tests.conftest import Api
from tests.integration.oauth.conftest import SCOPE, TYPE


def body(settings: Settings, **changes: Any) -> dict[str, Any]:
    return {"subject": {"iss": settings.public_url, "sub": "alice"}, "kind": "oauth",
            "credential_type": TYPE, "message": "Connect your Example account", **changes}


def test_a_connection_is_asked_for_with_the_types_scopes_by_default(
    api: Api, settings: Settings,
) -> None:
    created = api.post("/api/v1/elicitations", body(settings))
    assert created.status_code == 201, created.get_data(as_text=True)
    answer = created.get_json()
    assert answer["kind"] == "oauth"
    assert answer["scopes"] == SCOPE.split()
    assert answer["url"] == f"{settings.public_url}/e/{answer['id']}"
    assert answer["mcp"]["url"] == answer["url"]


def test_scopes_outside_the_types_list_are_refused_naming_them(
    api: Api, settings: Settings,
) -> None:
    refused = api.post("/api/v1/elicitations", body(settings, scopes=["repo", "admin:org"]))
    assert refused.status_code == 422
    problem = refused.get_json()
    assert problem["field"] == "scopes"
    assert "admin:org" in problem["detail"]
    assert "repo" in problem["detail"]  # what the type offers


@pytest.mark.parametrize(("kind", "type_id", "words"), [
    ("api_key", TYPE, "ask with kind oauth"),
    ("oauth", "generic", "ask with kind api_key"),
    ("oauth", "nonesuch", "unknown oauth credential_type"),
])
def test_the_kind_must_match_the_types(api: Api, settings: Settings, kind: str, type_id: str,
                                       words: str) -> None:
    refused = api.post("/api/v1/elicitations", body(settings, kind=kind,
                                                    credential_type=type_id))
    assert refused.status_code == 422
    assert words in refused.get_json()["detail"]


def test_a_pending_connection_is_reused_only_for_the_same_scopes(
    api: Api, settings: Settings,
) -> None:
    first = api.post("/api/v1/elicitations", body(settings, scopes=["openid", "repo"]))
    again = api.post("/api/v1/elicitations", body(settings, scopes=["openid", "repo"]))
    other = api.post("/api/v1/elicitations", body(settings, scopes=["openid"]))
    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 201)
    assert again.get_json()["id"] == first.get_json()["id"]
    assert other.get_json()["id"] != first.get_json()["id"]


def test_the_openapi_document_offers_this_gateways_oauth_types(api: Api) -> None:
    document = api.get("/api/v1/openapi.json").get_json()
    schema = document["components"]["schemas"]["CreateOAuthElicitation"]
    assert schema["properties"]["credential_type"]["enum"] == [TYPE]
    api_key = document["components"]["schemas"]["CreateApiKeyElicitation"]
    assert TYPE not in api_key["properties"]["credential_type"]["enum"]
