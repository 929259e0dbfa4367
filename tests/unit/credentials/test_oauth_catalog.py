"""OAuth credential types in the catalog: what a valid entry gives, and one line per mistake."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway import resources
from gateway.credentials.catalog import (
    Catalog,
    CatalogError,
    load_catalog,
    origin_of,
    provider_url_problem,
)

pytestmark = pytest.mark.backend_independent

GENERIC = '[generic]\nlabel = "Key"\n'
ENV = {"EXAMPLE_SECRET": "s3cret"}


def entry(**oauth: str) -> str:
    lines = {"authorization_url": '"https://id.example.com/authorize"',
             "token_url": '"https://id.example.com/token"', "client_id": '"gateway"',
             "client_secret_env": '"EXAMPLE_SECRET"', "scopes": '["read", "write"]', **oauth}
    body = "".join(f"{key} = {value}\n" for key, value in lines.items() if value)
    return f'{GENERIC}[example]\nlabel = "Example account"\nkind = "oauth"\n[example.oauth]\n{body}'


def load(tmp_path: Path, text: str, environ: dict[str, str] | None = None,
         insecure: tuple[str, ...] = ()) -> Catalog:
    path = tmp_path / "types.toml"
    path.write_text(text)
    return load_catalog(path, environ=ENV if environ is None else environ,
                        allows_insecure=lambda host, port: f"{host}:{port}" in insecure)


def test_a_valid_entry_is_an_oauth_type_with_its_secret_from_the_environment(
    tmp_path: Path,
) -> None:
    path = tmp_path / "types.toml"
    path.write_text(entry(extra_authorize_params='{ access_type = "offline" }',
                          revocation_url='"https://id.example.com/revoke"'))
    catalog = load_catalog(path, environ=ENV)
    example = catalog.get("example")
    assert example is not None
    assert example.kind == "oauth"
    assert example.oauth is not None
    assert example.oauth.client_secret is not None
    assert example.oauth.client_secret.reveal() == "s3cret"
    assert "s3cret" not in repr(example)
    assert example.oauth.scopes == ("read", "write")
    assert example.oauth.account_fields == ("login", "email", "sub")
    assert example.oauth.extra_authorize_params == (("access_type", "offline"),)
    assert example.oauth.host == "id.example.com"
    assert catalog.ids_of("oauth") == ["example"]
    assert "example" not in catalog.ids_of("api_key")


def test_an_issuer_alone_is_enough(tmp_path: Path) -> None:
    catalog = load(tmp_path, entry(authorization_url="", token_url="",
                                   issuer='"https://accounts.example.com"'))
    example = catalog.get("example")
    assert example is not None
    assert example.oauth is not None
    assert example.oauth.issuer == "https://accounts.example.com"


def test_a_public_client_needs_no_secret(tmp_path: Path) -> None:
    catalog = load(tmp_path, entry(client_secret_env="", token_auth_method='"none"'), environ={})
    example = catalog.get("example")
    assert example is not None
    assert example.oauth is not None
    assert example.oauth.client_secret is None


def test_plain_http_only_to_a_listed_development_host(tmp_path: Path) -> None:
    text = entry(authorization_url='"http://127.0.0.1:9000/auth"',
                 token_url='"http://127.0.0.1:9000/token"')
    with pytest.raises(CatalogError, match="GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS"):
        load(tmp_path, text)
    assert load(tmp_path, text, insecure=("127.0.0.1:9000",))


@pytest.mark.parametrize(("changes", "environ", "words"), [
    ({}, {}, "environment variable EXAMPLE_SECRET (client_secret_env) is not set"),
    ({"token_url": ""}, ENV, "give issuer, or both authorization_url and token_url"),
    ({"token_url": '"http://id.example.com/token"'}, ENV, "token_url must be an https:// URL"),
    ({"scopes": '["read write"]'}, ENV, "scopes is a list of scope names"),
    ({"scopes": '["read", "read"]'}, ENV, "lists a scope twice"),
    ({"client_id": ""}, ENV, "client_id is required"),
    ({"colour": '"red"'}, ENV, "unknown key 'colour'"),
    ({"token_auth_method": '"private_key_jwt"'}, ENV, "token_auth_method is one of"),
    ({"token_auth_method": '"none"'}, ENV, "client_secret_env is required unless"),
    ({"extra_authorize_params": '{ state = "x" }'}, ENV, "may not set 'state'"),
    ({"client_secret_env": '"not a name"'}, ENV, "name of an environment variable"),
    ({"timeout_seconds": "90"}, ENV, "timeout_seconds"),
])
def test_a_bad_entry_is_refused_in_one_line_naming_the_key(
    tmp_path: Path, changes: dict[str, str], environ: dict[str, str], words: str,
) -> None:
    with pytest.raises(CatalogError) as caught:
        load(tmp_path, entry(**changes), environ=environ)
    assert words in str(caught.value)
    assert "[example.oauth]" in str(caught.value) or "[example]" in str(caught.value)
    assert "\n" not in str(caught.value)


def development(host: str, port: int) -> bool:
    return f"{host}:{port}" == "127.0.0.1:9000"


@pytest.mark.parametrize(("url", "words"), [
    ("https://idp.example.com;frame-ancestors *;/authorize", "holds a character"),
    ("https://idp.example.com/authorize;x", "holds a character"),
    ("https://idp.example.com/a b", "holds a character"),
    ('https://idp.example.com/"', "holds a character"),
    ("https://idp.example.com/\r\nSet-Cookie:x", "holds a character"),
    ("https://idp.exämple.com/", "holds a character"),
    ("http://idp.example.com/authorize", "must be an https:// URL"),
    ("http://127.0.0.1:9001/authorize", "must be an https:// URL"),
    ("javascript://idp.example.com/", "must be an https:// URL"),
    ("https://user:pw@idp.example.com/authorize", "user name or password"),
    ("https://idp.example.com@evil.example/authorize", "user name or password"),
    ("https://idp_example.com/authorize", "no valid host name"),
    ("https://idp.example.com./authorize", "no valid host name"),
    ("https:///authorize", "no valid host name"),
    ("https://idp.example.com:0/authorize", "invalid port"),
    ("https://idp.example.com:99999/authorize", "invalid port"),
    ("https://idp.example.com:/authorize", "invalid host or port"),
    ("https://idp.example.com/authorize#top", "fragment"),
])
def test_the_provider_url_rule_refuses(url: str, words: str) -> None:
    problem = provider_url_problem(url, development)
    assert problem is not None
    assert words in problem


@pytest.mark.parametrize(("url", "origin"), [
    ("https://idp.example.com/authorize?prompt=consent", "https://idp.example.com"),
    ("https://IDP.Example.com:443/authorize", "https://idp.example.com"),
    ("https://idp.example.com:8443/authorize", "https://idp.example.com:8443"),
    ("https://[2001:db8::1]:8443/authorize", "https://[2001:db8::1]:8443"),
    ("http://127.0.0.1:9000/auth", "http://127.0.0.1:9000"),
])
def test_a_fit_url_gives_the_origin_a_csp_source_is_built_from(url: str, origin: str) -> None:
    assert provider_url_problem(url, development) is None
    assert origin_of(url) == origin


@pytest.mark.parametrize("key", ["authorization_url", "token_url", "revocation_url",
                                 "userinfo_url", "issuer"])
def test_every_provider_url_of_the_catalog_is_held_to_the_rule(tmp_path: Path, key: str) -> None:
    with pytest.raises(CatalogError) as caught:
        load(tmp_path, entry(**{key: '"https://idp.example.com;frame-ancestors *;/x"'}))
    assert f"[example.oauth]: {key} holds a character" in str(caught.value)


@pytest.mark.parametrize(("text", "words"), [
    (f'{GENERIC}[x]\nlabel = "X"\nkind = "oauth"\n', "needs an [x.oauth] table"),
    (f'{GENERIC}[x]\nlabel = "X"\nkind = "oauth"\npattern = "a"\n[x.oauth]\n',
     "pattern is for api_key types"),
    (f'{GENERIC}[x]\nlabel = "X"\n[x.oauth]\nclient_id = "a"\n', 'needs kind = "oauth"'),
    (f'{GENERIC}[x]\nlabel = "X"\nkind = "saml"\n', "kind is api_key or oauth"),
])
def test_kind_and_table_go_together(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(CatalogError, match=re.escape(words)):
        load(tmp_path, text)


def test_the_shipped_examples_are_valid_once_uncommented(tmp_path: Path) -> None:
    shipped = (resources.CONFIG / "credential_types.toml").read_text()
    examples = "\n".join(line[2:] if line.startswith("# ") or line == "#" else line
                         for line in _oauth_examples(shipped).splitlines())
    environ = dict.fromkeys(re.findall(r'client_secret_env = "([A-Z_]+)"', examples), "secret")
    catalog = load(tmp_path, f"{GENERIC}{examples}", environ=environ)
    assert catalog.ids_of("oauth") == ["github-oauth", "google", "oidc-example", "slack"]


def _oauth_examples(shipped: str) -> str:
    # The entries, from the first table on; the explanation above them stays a comment.
    section = shipped[shipped.index("# --- OAuth connections (examples) ---"):]
    return section[section.index("\n# [") + 1:]
