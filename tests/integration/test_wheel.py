"""The wheel carries templates, static files and config: installed elsewhere, it serves a page."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.backend_independent]

RENDER_PAGE = textwrap.dedent("""
    import gateway, gateway.resources as r
    from gateway.app import create_app
    from gateway.settings import load_settings
    assert "site-packages" in gateway.__file__, gateway.__file__
    assert (r.CONFIG / "gateway.example.toml").is_file()
    client = create_app(load_settings()).test_client()
    page = client.get("/", base_url="https://localhost:8443")
    assert page.status_code == 200, page.status_code
    assert b"Secure entry portal" in page.data
    with client.get("/static/gateway.css", base_url="https://localhost:8443") as css:
        assert css.status_code == 200 and b"system-ui" in css.data
    print("rendered from", gateway.__file__)
""")


def test_wheel_installs_and_renders_a_page_outside_the_checkout(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(dist), str(REPO)], check=True, timeout=300)
    wheel = next(dist.glob("gateway-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)], check=True,
                   timeout=600)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"PATH": os.environ["PATH"], "GATEWAY_INSTANCE_PATH": str(elsewhere / "instance"),
           "GATEWAY_SECRET_KEY": "k" * 40, "GATEWAY_TOKEN_PEPPER": "p" * 40}
    rendered = subprocess.run([str(python), "-c", RENDER_PAGE], cwd=elsewhere, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
    assert rendered.returncode == 0, rendered.stderr
    assert str(REPO) not in rendered.stdout
    command = subprocess.run([str(venv / "bin" / "gateway"), "--help"], cwd=elsewhere,
                             env=env, capture_output=True, text=True, timeout=60, check=False)
    assert command.returncode == 0
    assert "serve" in command.stdout
