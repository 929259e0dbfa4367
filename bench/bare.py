"""The baseline: a bare Flask app answering every scenario's path, under the gateway's gunicorn.

Run as ``python bench/bare.py CONFIG.json``, where the file holds the gunicorn
settings the runner computed for the gateway (only the bind port differs).
Same workers, threads, TLS certificate and access log: whatever separates the
two targets' numbers is the gateway's own code.

It imports Flask, gunicorn and the scenarios, never the gateway: the baseline
would no longer be bare.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from flask import Flask
from gunicorn.app.base import BaseApplication
from scenarios import SCENARIOS, View


def create_app() -> Flask:
    """A Flask app with each scenario's bare view (and held request's) on its rule."""
    app = Flask("bare")
    views: dict[str, View] = {}
    for scenario in SCENARIOS.values():
        _add(app, views, scenario.rule, scenario.bare_view, scenario.name)
        if scenario.hold:
            _add(app, views, scenario.hold.rule, scenario.hold.bare_view, f"{scenario.name}-hold")
    return app


def _add(app: Flask, views: dict[str, View], rule: str, view: View, endpoint: str) -> None:
    """Register ``view`` on ``rule`` once; scenarios may share a rule, not disagree on it."""
    known = views.get(rule)
    if known is view:
        return
    if known is not None:
        raise ValueError(f"two different bare views for {rule!r} (scenario {endpoint!r}); "
                         "define the view once and give the same one to both")
    views[rule] = view
    app.add_url_rule(rule, endpoint=endpoint, view_func=view,
                     methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"])


class BareServer(BaseApplication):  # type: ignore[misc]
    """gunicorn with a given settings dict, loading the bare app in each worker."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._config = config
        super().__init__()

    def load_config(self) -> None:
        # As the gateway's server does: an older gunicorn lacks the newest keys.
        for key, value in self._config.items():
            if key in self.cfg.settings:
                self.cfg.set(key, value)

    def load(self) -> Flask:
        return create_app()


def main(argv: list[str]) -> None:
    """Serve the bare app with the gunicorn settings in the JSON file ``argv[1]``."""
    if len(argv) != 2:
        sys.exit("usage: bare.py GUNICORN_CONFIG.json")
    config = json.loads(Path(argv[1]).read_text())
    BareServer(config).run()


if __name__ == "__main__":
    main(sys.argv)
