"""The web edge: HTTPS and host enforcement, body limits, security headers, errors, health."""

from __future__ import annotations

from flask import Flask

from gateway.settings import Settings
from gateway.web import bodies, errors, headers, https, proxies, views


def init_app(app: Flask, settings: Settings) -> None:
    """Install the edge's hooks and routes on the app."""
    errors.init_app(app)  # first: every later hook may need the request id
    proxies.init_app(app, settings)  # before https: it rules on what the proxy reported
    https.init_app(app)
    bodies.init_app(app)
    headers.init_app(app, settings)
    app.register_blueprint(views.blueprint)
