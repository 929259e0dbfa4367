"""The mix-up rule (RFC 9700 section 4.4, RFC 9207): which returns a type's redirect URI takes."""

from __future__ import annotations

import pytest

from gateway.elicitations.models import Elicitation
from gateway.oauth.provider import Endpoints
from gateway.oauth.service import mix_up

pytestmark = pytest.mark.backend_independent

ISSUER = "https://id.example.com"


def endpoints(issuer: str | None, *, promises_iss: bool = False) -> Endpoints:
    return Endpoints(f"{ISSUER}/authorize", f"{ISSUER}/token", None, None, issuer, None,
                     promises_iss)


def for_type(type_id: str) -> Elicitation:
    return Elicitation(id="el_x", kind="oauth", credential_type=type_id)


@pytest.mark.parametrize(("state_type", "found", "iss", "reason"), [
    ("example", endpoints(ISSUER, promises_iss=True), ISSUER, None),
    ("example", endpoints(ISSUER), None, None),  # not promised: may be left out
    ("example", endpoints(ISSUER, promises_iss=True), None, "issuer-missing"),
    ("example", endpoints(ISSUER), "https://other.example.com", "issuer-mismatch"),
    ("example", endpoints(ISSUER), f"{ISSUER}/", "issuer-mismatch"),  # simple string comparison
    ("other", endpoints(ISSUER), ISSUER, "redirect-uri-of-another-type"),
    ("other", endpoints(None), None, "redirect-uri-of-another-type"),
    # No issuer in the catalog: nothing to compare with; the type's own URI is the defence.
    ("example", endpoints(None), "https://anything.example.com", None),
])
def test_a_return_is_a_mix_up_when(state_type: str, found: Endpoints, iss: str | None,
                                   reason: str | None) -> None:
    refused = mix_up(for_type(state_type), "example", found, iss)
    assert (refused.details["reason"] if refused else None) == reason
