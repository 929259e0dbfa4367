"""The current app's settings, clock and client names, for views and the services they call."""

from __future__ import annotations

from flask import current_app

from gateway import db
from gateway.clients.service import ClientNames
from gateway.clock import Clock
from gateway.settings import Settings


def current_settings() -> Settings:
    """The settings of the app handling this request."""
    settings: Settings = current_app.extensions["gateway.settings"]
    return settings


def current_clock() -> Clock:
    """The clock of the app handling this request (a fixed one in tests)."""
    clock: Clock = current_app.extensions["gateway.clock"]
    return clock


def client_name(client_id: str) -> str:
    """The client's registered name, as pages show it to users."""
    names: ClientNames = current_app.extensions["gateway.client_names"]
    return names.of(client_id, db.session())
