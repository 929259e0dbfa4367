"""The baseline: a bare Flask app answering every scenario's path, under the gateway's gunicorn.

Run as ``python bench/bare.py CONFIG.json``, where the file holds the
gunicorn settings the runner computed for the gateway (only the bind port
differs). Same workers, threads, TLS certificate and access log: whatever
separates the two targets' numbers is the gateway's own code. With
``BENCH_FLOOR_DATABASE`` in its environment (``sqlite:PATH`` or
``postgresql://…``), each scenario's view first makes the database
statements of the scenario's floor there (see floor.py); in the
environment, not on the command line, where any user of the machine could
read a password in the URL.

It imports Flask, gunicorn, the scenarios and the floor, never the gateway:
the baseline would no longer be bare.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from flask import Flask
from floor import ENVIRONMENT, FloorDatabase, check_steps, with_floor
from gunicorn.app.base import BaseApplication
from scenarios import SCENARIOS, View


def create_app(floor: FloorDatabase | None = None) -> Flask:
    """A Flask app with each scenario's bare view (and held request's) on its rule.

    With ``floor``, each scenario's view makes its floor's statements there
    first, and so does a held request answered by the same view: the
    gateway's long-polls, too, check their token and read before they wait.
    """
    app = Flask("bare")
    floored: dict[View, View] = {}
    for scenario in SCENARIOS.values():
        if floor is not None and scenario.floor:
            check_steps(scenario.name, scenario.floor)
            # Scenarios may share a bare view; they then share its floor too.
            floored.setdefault(scenario.bare_view,
                               with_floor(scenario.bare_view, scenario.floor, floor))
    views: dict[str, View] = {}
    for scenario in SCENARIOS.values():
        view = scenario.bare_view
        _add(app, views, scenario.rule, floored.get(view, view), scenario.name)
        if scenario.hold:
            held = scenario.hold.bare_view
            _add(app, views, scenario.hold.rule, floored.get(held, held),
                 f"{scenario.name}-hold")
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

    def __init__(self, config: dict[str, Any], floor: FloorDatabase | None = None) -> None:
        self._config = config
        self._floor = floor
        super().__init__()

    def load_config(self) -> None:
        # As the gateway's server does: an older gunicorn lacks the newest keys.
        for key, value in self._config.items():
            if key in self.cfg.settings:
                self.cfg.set(key, value)

    def load(self) -> Flask:
        return create_app(self._floor)


def main(argv: list[str] | None = None) -> None:
    """Serve the bare app with the gunicorn settings of a JSON file; a floor if one is set."""
    parser = argparse.ArgumentParser(description="The benchmark's bare Flask app.")
    parser.add_argument("config", type=Path, help="the gunicorn settings, as JSON")
    args = parser.parse_args(argv)
    config = json.loads(args.config.read_text())
    floor = None
    if target := os.environ.get(ENVIRONMENT):
        floor = FloorDatabase(target)
        floor.create_table()
    BareServer(config, floor).run()


if __name__ == "__main__":
    main()
