"""A key's shape: which characters a key may never hold, whatever its type."""

from __future__ import annotations

import pytest

from gateway import resources
from gateway.credentials.catalog import GENERIC, CredentialType, load_catalog
from gateway.credentials.service import InvalidSecret, check_shape

pytestmark = pytest.mark.backend_independent


@pytest.fixture(scope="module")
def generic() -> CredentialType:
    credential_type = load_catalog(resources.CONFIG / "credential_types.toml").get(GENERIC)
    assert credential_type is not None
    return credential_type


@pytest.mark.parametrize("character", ["\x00", "\t", "\r", "\x1f", "\x7f", "\x80", "\x85", "\x9f"],
                         ids=["nul", "tab", "carriage-return", "unit-separator", "delete",
                              "c1-first", "next-line", "c1-last"])
def test_a_control_character_anywhere_is_refused(generic: CredentialType,
                                                 character: str) -> None:
    for secret in (character + "key-text", "key" + character + "text", "key-text" + character):
        with pytest.raises(InvalidSecret) as refused:
            check_shape(generic, secret)
        assert "control characters" in refused.value.detail
        assert secret not in refused.value.detail


@pytest.mark.parametrize("secret", [" spaced key ", "clé-\u00e9t\u00e9", "\u00a0no-break",
                                    "~!@#$%^&*()"],
                         ids=["space", "accents", "no-break-space", "punctuation"])
def test_printable_characters_pass_a_type_without_a_pattern(generic: CredentialType,
                                                            secret: str) -> None:
    check_shape(generic, secret)


@pytest.mark.parametrize(("type_id", "opening"), [("openai", "An OpenAI API key has at least"),
                                                  ("github", "A GitHub token has at least")])
def test_the_message_names_the_key_with_the_right_article(type_id: str, opening: str) -> None:
    credential_type = load_catalog(resources.CONFIG / "credential_types.toml").get(type_id)
    assert credential_type is not None
    with pytest.raises(InvalidSecret) as refused:
        check_shape(credential_type, "short")
    assert refused.value.detail.startswith(opening)
