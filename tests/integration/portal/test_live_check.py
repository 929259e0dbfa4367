"""Live key checks against a service on loopback, and the canary: a key goes nowhere else."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from flask import Flask
from sqlalchemy import select

from gateway import db
from gateway.credentials import service as credentials
from gateway.credentials.models import Credential
from tests.conftest import Api
from tests.integration.portal.conftest import Browser

GOOD = "canary-key-0b5d7e1f9a2c4e6a"
REVOKED = "canary-key-revoked-000000000"
FLAKY = "canary-key-flaky-0000000000"


class FakeService(BaseHTTPRequestHandler):
    """Answers like a key-issuing API: 200 for the good key, 401 for others, 502 when flaky."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        FakeService.seen.append({"path": self.path, **dict(self.headers)})
        key = self.headers.get("Authorization", "").removeprefix("Bearer ")
        status = 200 if key == GOOD else 502 if key == FLAKY else 401
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:  # keep the test output quiet
        pass


@pytest.fixture(scope="module")
def service() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeService)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def base_environ(base_environ: dict[str, str], service: str, tmp_path: Path) -> dict[str, str]:
    """A catalog with a checked type whose service is the fake one on loopback."""
    catalog = tmp_path / "types.toml"
    catalog.write_text(f"""
[generic]
label = "API key"

[weather]
label = "Weather API key"
pattern = 'canary-key-[a-z0-9-]{{10,40}}'

[weather.check]
url = "http://{service}/v1/me"
header = "Authorization"
value = "Bearer {{key}}"
headers = {{ "Accept" = "application/json" }}
""")
    return {**base_environ, "GATEWAY_CREDENTIAL_TYPES_FILE": str(catalog),
            "GATEWAY_OUTBOUND_ALLOW_INSECURE_HOSTS": service}


@pytest.fixture
def alices(browser: Callable[[], Browser], alice: str) -> Browser:
    logged_in = browser()
    logged_in.log_in(alice)
    return logged_in


def submit(browser: Browser, link: dict[str, Any], secret: str) -> Any:
    return browser.post_form(f"/e/{link['id']}", {"action": "submit", "secret": secret})


def test_a_key_the_service_accepts_is_stored(
    alices: Browser, link_for: Callable[..., dict[str, Any]], api: Api,
) -> None:
    FakeService.seen.clear()
    link = link_for("alice", credential_type="weather")
    assert submit(alices, link, GOOD).status_code == 200
    [call] = FakeService.seen
    assert call["path"] == "/v1/me"
    assert call["Authorization"] == f"Bearer {GOOD}"
    assert call["Accept"] == "application/json"
    [stored] = api.get("/api/v1/credentials").get_json()["items"]
    assert api.post(f"/api/v1/credentials/{stored['id']}/reveal").get_json()["secret"] == GOOD


def test_a_key_the_service_refuses_can_be_corrected(
    alices: Browser, link_for: Callable[..., dict[str, Any]], api: Api,
) -> None:
    link = link_for("alice", credential_type="weather")
    refused = submit(alices, link, REVOKED)
    assert refused.status_code == 422
    text = refused.get_data(as_text=True)
    assert "does not work" in text
    assert REVOKED not in text
    assert api.get(f"/api/v1/elicitations/{link['id']}").get_json()["status"] == "opened"
    assert submit(alices, link, GOOD).status_code == 200


def test_a_service_that_cannot_answer_stores_nothing(
    alices: Browser, link_for: Callable[..., dict[str, Any]], api: Api,
) -> None:
    link = link_for("alice", credential_type="weather")
    response = submit(alices, link, FLAKY)
    assert response.status_code == 503
    assert "could not check" in response.get_data(as_text=True)
    assert api.get("/api/v1/credentials?status=all").get_json()["items"] == []


def test_the_canary_key_is_nowhere_but_the_vault_and_the_reveal(
    app: Flask, alices: Browser, link_for: Callable[..., dict[str, Any]], api: Api,
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, urllib3's request lines included
    seen: list[str] = []

    def answer(response: Any) -> None:
        seen.append(response.get_data(as_text=True))
        seen.extend(f"{name}: {value}" for name, value in response.headers.items())

    # Pattern failure, live-check failure, service unavailable, server error, success.
    canary = "canary-key-1d2e3f4a5b6c7d8e"
    wrong_shape = "canary key with spaces 1d2e3f"
    for secret in (wrong_shape, REVOKED, FLAKY):
        answer(submit(alices, link_for("alice", credential_type="weather"), secret))

    def explode(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the database fell over")

    failing = link_for("alice", credential_type="generic")
    with monkeypatch.context() as patch:
        patch.setattr(credentials, "capture", explode)
        broken = submit(alices, failing, canary)
    assert broken.status_code == 500
    answer(broken)

    link = link_for("alice", credential_type="generic")
    done = submit(alices, link, canary)
    answer(done)
    [stored] = api.get("/api/v1/credentials").get_json()["items"]
    answer(api.get(f"/api/v1/elicitations/{link['id']}"))
    answer(api.get("/api/v1/credentials?status=all"))
    revealed = api.post(f"/api/v1/credentials/{stored['id']}/reveal")
    assert revealed.get_json()["secret"] == canary  # the one place it may appear

    with app.app_context():
        stored_rows = "\n".join(repr(row) for table in db.Base.metadata.sorted_tables
                                for row in db.session().execute(select(table)))
        ciphertexts = [c.ciphertext for c in db.session().scalars(select(Credential))]
    logs = "\n".join(f"{r.getMessage()} {r.exc_text or ''} {r.args!r}" for r in caplog.records)
    for secret in (canary, wrong_shape, REVOKED, FLAKY):
        for where, text in (("a response", "\n".join(seen)), ("a log record", logs),
                            ("a column", stored_rows)):
            assert secret not in text, f"{secret} leaked into {where}"
        assert all(secret.encode() not in blob for blob in ciphertexts)
