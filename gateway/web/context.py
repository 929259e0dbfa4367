"""The current app's settings and clock, for views and the services they call."""

from __future__ import annotations

from flask import current_app

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
