"""Where the templates, static files and shipped config are.

In a checkout they sit at the top of the repository; in an installed wheel
they are carried inside the package (see pyproject.toml).
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    """The folder ``name`` (templates, static, config) for this installation."""
    inside = PACKAGE / name
    return inside if inside.is_dir() else PACKAGE.parent / name


TEMPLATES = resource_dir("templates")
STATIC = resource_dir("static")
CONFIG = resource_dir("config")
