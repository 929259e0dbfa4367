"""The credential type catalog: the shipped file, and one-line errors for a bad one."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway import resources
from gateway.credentials.catalog import GENERIC, CatalogError, load_catalog

pytestmark = pytest.mark.backend_independent


def test_the_shipped_catalog_has_generic_with_the_documented_bounds() -> None:
    catalog = load_catalog(resources.CONFIG / "credential_types.toml")
    generic = catalog.get(GENERIC)
    assert generic is not None
    assert (generic.min_length, generic.max_length, generic.pattern) == (1, 4096, None)


@pytest.mark.parametrize(("text", "words"), [
    ('[generic]\nlabel = "Key"\n[open-ai]\nlabel = "x"\npattern = "("\n', "[open-ai]: pattern"),
    ('[generic]\nlabel = "Key"\ncolour = "red"\n', "unknown key 'colour'"),
    ('[other]\nlabel = "Key"\n', "'generic' must be present"),
    ('[generic]\n', "label is required"),
    ('[generic]\nlabel = "Key"\nmax_length = 5000\n', "max_length"),
    ('[generic]\nlabel = "Key"\nlink = "http://example.com"\n', "https"),
    ('["Bad Id"]\nlabel = "Key"\n', "ids are lower-case"),
    ("[generic\n", "not valid TOML"),
    ('[generic]\nlabel = "Key"\nhint = "no"\n', "[generic]: hint is true or false"),
    ('[generic]\nlabel = "Key"\nhint = 0\n', "[generic]: hint is true or false"),
    ('[generic]\nlabel = "Key"\n[gh]\nlabel = "GitHub"\nkind = "oauth"\nhint = false\n'
     '[gh.oauth]\nissuer = "https://id.example.com"\nclient_id = "c"\n'
     'token_auth_method = "none"\n', "[gh]: hint is for api_key types, not oauth"),
])
def test_a_bad_catalog_names_type_and_key(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "types.toml"
    path.write_text(text)
    with pytest.raises(CatalogError) as caught:
        load_catalog(path)
    assert words in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_missing_catalog_says_where(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="cannot read"):
        load_catalog(tmp_path / "absent.toml")


def test_a_type_keeps_a_hint_unless_its_table_turns_it_off(tmp_path: Path) -> None:
    path = tmp_path / "types.toml"
    path.write_text('[generic]\nlabel = "Key"\n[vault]\nlabel = "Vault token"\nhint = false\n'
                    '[shown]\nlabel = "Shown"\nhint = true\n')
    catalog = load_catalog(path)
    assert {credential_type.id: credential_type.hint for credential_type in catalog} == {
        "generic": True, "vault": False, "shown": True}


def test_every_shipped_key_type_keeps_its_hint() -> None:
    catalog = load_catalog(resources.CONFIG / "credential_types.toml")
    assert all(credential_type.hint for credential_type in catalog)
