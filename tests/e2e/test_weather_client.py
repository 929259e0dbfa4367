"""The walk-through client of docs/sdk.md (examples/weather_client.py), run as a person would.

The script signs in through the browser (here Chromium, signing in at the
provider as alice and allowing the client), calls the example's tool and
prints the gateway's link; the same browser opens it, already signed in at
the provider, and saves the key; the script prints the forecast.
"""

from __future__ import annotations

import os
import queue
import secrets
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.conftest import WeatherServer, enter_key, sign_in
from tests.e2e.mcp_user import LEGACY, MODERN, WAIT
from tests.oidc.fixtures import OidcProvider

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("mode", [LEGACY, MODERN])]

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "weather_client.py"


class Script:
    """The running script: its output, line by line, as it comes."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        assert process.stdout is not None
        threading.Thread(target=self._read, args=(process.stdout,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next_line(self) -> str:
        try:
            line = self.lines.get(timeout=WAIT)
        except queue.Empty:
            raise AssertionError(f"no output within {WAIT} s after {self.seen}") from None
        assert line is not None, f"the script ended after {self.seen}"
        self.seen.append(line)
        return line

    def url_after(self, label: str) -> str:
        line = self.next_line()
        assert line.startswith(f"{label}: "), self.seen
        return line.removeprefix(f"{label}: ")


@pytest.fixture
def run_script(weather: WeatherServer, oidc_provider: OidcProvider,
               tmp_path: Path) -> Iterator[Callable[..., Script]]:
    started: list[subprocess.Popen[str]] = []
    loopback = urlsplit(oidc_provider.other_redirect_uris[1])
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OIDC_"))}
    environ.update({"OIDC_ISSUER": oidc_provider.issuer,
                    "OIDC_CLIENT_ID": oidc_provider.other_client_id,
                    "OIDC_CLIENT_SECRET": oidc_provider.other_client_secret})

    def run(*args: str) -> Script:
        process = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--mcp-url", weather.mcp_url, "--no-browser",
             "--redirect-port", str(loopback.port), *args],
            env=environ, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        started.append(process)
        return Script(process)

    yield run
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()
        assert process.stdout is not None
        process.stdout.close()


def test_the_readme_client_signs_in_calls_the_forecast_and_gets_it_after_the_link(
    mode: str, run_script: Callable[..., Script], oidc_provider: OidcProvider,
    new_page: Callable[[], Page],
) -> None:
    script = run_script("--mode", mode, "forecast", "city=Oslo")
    page = new_page()
    page.goto(script.url_after("sign in"))
    sign_in(page, oidc_provider, "alice")
    page.get_by_role("button", name="Allow").click()  # the provider asks once for this client
    expect(page.locator("body")).to_contain_text("Signed in. You can close this tab")

    assert script.next_line() == "Connect your weather service API key to get forecasts."
    link = script.url_after("open")
    key = f"wx-live-{secrets.token_hex(12)}"
    # The same browser: signed in at the provider already, so straight to the link.
    page.goto(link)
    enter_key(page, link, key)

    assert script.next_line() == (
        f"Tomorrow in Oslo: sunny, 21 °C (fetched with your key …{key[-4:]})")
    assert script.process.wait(timeout=WAIT) == 0
