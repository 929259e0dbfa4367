""""a" or "an" before a credential type's label, by how the label is said."""

from __future__ import annotations

import pytest

from gateway import resources
from gateway.credentials.catalog import load_catalog
from gateway.wording import article, with_article

pytestmark = pytest.mark.backend_independent


@pytest.mark.parametrize(("phrase", "expected"), [
    ("OpenAI API key", "an OpenAI API key"),
    ("Anthropic API key", "an Anthropic API key"),
    ("API key", "an API key"),
    ("HTTP token", "an HTTP token"),
    ("SSH key", "an SSH key"),
    ("Hugging Face access token", "a Hugging Face access token"),
    ("GitHub token", "a GitHub token"),
    ("URL signing secret", "a URL signing secret"),
    ("JWT", "a JWT"),
    ("Access token", "an Access token"),
    ("user token", "a user token"),
    ("one-time code", "a one-time code"),
    ("hourly quota key", "an hourly quota key"),
    ("Stripe key", "a Stripe key"),
    ("X token", "an X token"),
    ("8-digit PIN", "an 8-digit PIN"),
    ("80-character key", "an 80-character key"),
    ("11-word phrase", "an 11-word phrase"),
    ("110-character key", "a 110-character key"),
    ("2FA code", "a 2FA code"),
])
def test_the_article_follows_the_sound(phrase: str, expected: str) -> None:
    assert with_article(phrase) == expected


def test_every_shipped_label_reads_right() -> None:
    catalog = load_catalog(resources.CONFIG / "credential_types.toml")
    said = {credential_type.id: article(credential_type.label) for credential_type in catalog}
    assert said == {"generic": "an", "bearer": "an", "openai": "an", "anthropic": "an",
                    "github": "a", "huggingface": "a"}
