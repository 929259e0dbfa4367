"""The benchmark's modules, for tests: imported the way its runner imports them.

bench/ is not a package: its scripts import each other by bare name, with
their own folder first on the path.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench_module(name: str) -> ModuleType:
    """A module of bench/, imported with bench/ on the path."""
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))
