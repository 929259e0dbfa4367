"""Reading a process's log for the canary tests: well-formed lines, and what a secret looks like."""

from __future__ import annotations

import json
import re
from typing import Any

# A text record's start; a traceback's lines under it are indented.
TEXT_RECORD = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z "
                         r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")


def records(log: str, log_format: str) -> list[dict[str, Any]]:
    """Every record of a log, asserting that each line is one (or, in text, under one).

    A text record comes back as ``{"level", "logger", "line"}``.
    """
    found: list[dict[str, Any]] = []
    for line in log.splitlines():
        if log_format == "json":
            found.append(json.loads(line))
            continue
        match = TEXT_RECORD.match(line)
        if match is None:
            assert found, f"a log starts with a record, not {line!r}"
            assert line.startswith("    "), f"not a log line: {line!r}"
            continue
        level, rest = match.group(1), line[match.end(1) + 1:]
        found.append({"level": level.lower(), "logger": rest.split(":", 1)[0], "line": line})
    return found


def tell_tales(secret: str) -> list[str]:
    """A secret and the parts that would give it away: its body without the prefix, and
    the first 16 characters of that."""
    body = secret.split("_", 1)[-1]
    return [secret, body, body[:16]]


def assert_nowhere(secrets: list[str], **outputs: str) -> None:
    """None of the secrets is in any of the outputs (named for the failure message)."""
    for name, text in outputs.items():
        for secret in secrets:
            assert secret not in text, f"{secret!r} is in {name}"
