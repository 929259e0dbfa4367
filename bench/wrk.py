"""wrk, the load generator: installing it, a Lua script per request, running it, reading it.

wrk is driven through its text report (the one a person reads), so a result
can always be checked against what wrk itself printed; the raw report is kept
in the JSON results.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from scenarios import Request

# wrk's own units (src/units.c): times in us/ms/s/m/h, sizes base 1024.
_TIME_TO_MS: Final = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}
_SIZE_TO_BYTES: Final = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_TIME: Final = r"([\d.]+)(us|ms|s|m|h)"

_RATE = re.compile(r"^Requests/sec:\s+([\d.]+)\s*$", re.MULTILINE)
_PERCENTILE = re.compile(r"^\s+(\d+(?:\.\d+)?)%\s+" + _TIME + r"\s*$", re.MULTILINE)
_TOTAL = re.compile(r"^\s+(\d+) requests in " + _TIME + r", ([\d.]+)([KMGTP]?)B read", re.MULTILINE)
_SOCKET = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_STATUS = re.compile(r"Non-2xx or 3xx responses: (\d+)")
# Printed by the cycling script's done(): requests made over all threads, and
# the most made by one thread.
_PATHS = re.compile(r"^bench paths: sent (\d+), most per thread (\d+)$", re.MULTILINE)


class WrkError(Exception):
    """wrk is missing, failed, or printed a report we cannot read."""


@dataclass(frozen=True, slots=True)
class Report:
    """What one wrk run measured."""

    requests_per_second: float
    # Latency distribution, percentile label ("50", "99"...) to milliseconds.
    latency_ms: dict[str, float]
    requests: int
    duration_s: float
    bytes_read: int
    # connect/read/write/timeout, as wrk counts them.
    socket_errors: dict[str, int]
    # wrk counts status >= 400 here, despite its label "Non-2xx or 3xx".
    error_responses: int
    raw: str
    # With a cycling script (Request.paths): requests made over all threads,
    # those cut in flight at the end included, and the most made by one thread.
    paths_sent: int | None = None
    paths_most_per_thread: int | None = None

    @property
    def p50_ms(self) -> float:
        """Median latency."""
        return self.latency_ms["50"]

    @property
    def p99_ms(self) -> float:
        """99th percentile latency."""
        return self.latency_ms["99"]

    @property
    def problems(self) -> list[str]:
        """Why this run's numbers include failed requests; empty when none did."""
        found = [f"{self.error_responses} responses >= 400"] if self.error_responses else []
        found += [f"{count} socket {kind} errors"
                  for kind, count in self.socket_errors.items() if count]
        return found

    def as_json(self) -> dict[str, Any]:
        """The report as plain JSON values."""
        return {
            "requests_per_second": self.requests_per_second,
            "latency_ms": self.latency_ms,
            "requests": self.requests,
            "duration_s": self.duration_s,
            "bytes_per_response": round(self.bytes_read / self.requests) if self.requests else None,
            "socket_errors": self.socket_errors,
            "error_responses": self.error_responses,
            "problems": self.problems,
            **({"paths_sent": self.paths_sent} if self.paths_sent is not None else {}),
            "raw": self.raw,
        }


def ensure_installed() -> str:
    """The path of wrk, installed with apt-get (Debian's package ``wrk``) when missing."""
    found = shutil.which("wrk")
    if found:
        return found
    print("wrk is not installed; installing it with apt-get", file=sys.stderr)
    environ = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", "wrk"]):
        try:
            result = subprocess.run(command, env=environ, capture_output=True, text=True,
                                    check=False)
        except OSError as error:
            raise WrkError(f"cannot install wrk: {command[0]}: {error.strerror}") from None
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise WrkError(f"cannot install wrk: `{' '.join(command)}` failed: {last}")
    found = shutil.which("wrk")
    if not found:
        raise WrkError("cannot install wrk: apt-get succeeded but wrk is not on PATH")
    return found


def version(wrk: str) -> str:
    """wrk's version, e.g. "wrk 4.1.0 [epoll]" (it prints it with its usage, exiting 1)."""
    result = subprocess.run([wrk, "--version"], capture_output=True, text=True, check=False)
    first = (result.stdout.strip().splitlines() or ["unknown"])[0]
    return first.split(" Copyright")[0].strip()


def lua_string(value: str | bytes) -> str:
    """A Lua string literal holding exactly these bytes."""
    data = value.encode() if isinstance(value, str) else value
    # Three-digit decimal escapes, so a digit that follows cannot join the escape.
    return '"' + "".join(
        chr(byte) if 0x20 <= byte < 0x7F and byte not in b'"\\' else f"\\{byte:03d}"
        for byte in data
    ) + '"'


def lua_script(request: Request) -> str:
    """A wrk script that sends this request's method, headers and body.

    Without ``request.paths`` it sets only wrk's static request (no
    ``request()`` function), so wrk builds the request once and runs no Lua
    per request: the script costs the client nothing while measuring.

    With ``request.paths`` it adds wrk's dynamic request: a ``request()``
    function that sends each request to the next path (see ``_CYCLE``).
    """
    lines = [
        "-- Written by bench/wrk.py; the path comes from the URL on wrk's command line"
        + (", or from the paths below." if request.paths else "."),
        f"wrk.method = {lua_string(request.method)}",
    ]
    lines += [f"wrk.headers[{lua_string(name)}] = {lua_string(value)}"
              for name, value in request.headers.items()]
    if request.body is not None:
        # wrk.format adds Content-Length for a body.
        lines.append(f"wrk.body = {lua_string(request.body)}")
    if request.paths:
        lines.append("local paths = {")
        lines += [f"  {lua_string(path)}," for path in request.paths]
        lines.append("}")
        lines.append(_CYCLE)
    return "\n".join(lines) + "\n"


# The dynamic request: each of wrk's threads runs its own copy of the script,
# so the threads take the paths in turn (thread k of T: first + k, first + k + T,
# ...) and no two requests of one run go to the same path before the list wraps.
# `first` and T come as script arguments (script_args): the runner starts each
# run where the previous one against that target stopped. done() prints how
# many requests were made (those cut in flight included), for the runner.
# Per request this costs a Lua call, an addition, a modulo, a table lookup and
# one string concatenation: the request is built from a prefix and suffix
# made once per thread.
_CYCLE = """\
local threads = {}
function setup(thread)
  thread:set("thread_number", #threads)
  table.insert(threads, thread)
end
function init(args)
  local first = tonumber(args[1]) or 0
  local step = tonumber(args[2]) or 1
  position = first + thread_number
  stride = step
  sent = 0
  head = wrk.method .. " "
  tail = string.sub(wrk.format(nil, "/"), #head + 2)
end
function request()
  local path = paths[position % #paths + 1]
  position = position + stride
  sent = sent + 1
  return head .. path .. tail
end
function done(summary, latency, requests)
  local total, most = 0, 0
  for _, thread in ipairs(threads) do
    local count = thread:get("sent")
    total = total + count
    if count > most then most = count end
  end
  io.write(string.format("bench paths: sent %d, most per thread %d\\n", total, most))
end"""


def script_args(request: Request, first: int, threads: int) -> tuple[str, ...]:
    """The arguments a cycling script takes: where to start in the paths, and wrk's threads."""
    return (str(first), str(threads)) if request.paths else ()


def paths_used(report: Report, threads: int) -> int:
    """How far a cycling run moved along the paths: the next run starts that much later.

    Thread k made requests to first + k + T*j for j below its count, so
    T times the largest count covers every path any thread used.
    """
    return threads * (report.paths_most_per_thread or 0)


def run(wrk: str, url: str, script: Path, *, duration: int, connections: int,
        threads: int, args: Sequence[str] = ()) -> Report:
    """One wrk run against ``url``, with its latency distribution; ``args`` go to the script."""
    command = [wrk, f"--threads={threads}", f"--connections={connections}",
               f"--duration={duration}s", f"--script={script}", "--latency", url,
               *(["--", *args] if args else [])]
    try:
        # The timeout only catches a hung wrk; it is far above any run's length.
        result = subprocess.run(command, capture_output=True, text=True, check=False,
                                timeout=duration + 60)
    except subprocess.TimeoutExpired:
        raise WrkError(f"wrk did not finish within {duration + 60} s against {url}") from None
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise WrkError(f"wrk exited {result.returncode} against {url}: {last}")
    return parse(result.stdout)


def parse(text: str) -> Report:
    """Read wrk's text report (with ``--latency``)."""
    rate = _RATE.search(text)
    percentiles = {_label(number): float(value) * _TIME_TO_MS[unit]
                   for number, value, unit in _PERCENTILE.findall(text)}
    total = _TOTAL.search(text)
    if not rate or not total or "50" not in percentiles or "99" not in percentiles:
        raise WrkError("cannot read wrk's report:\n" + text)
    socket = _SOCKET.search(text)
    kinds = ("connect", "read", "write", "timeout")
    status = _STATUS.search(text)
    paths = _PATHS.search(text)
    requests, duration, unit, size, size_unit = total.groups()
    return Report(
        requests_per_second=float(rate.group(1)),
        latency_ms=percentiles,
        requests=int(requests),
        duration_s=float(duration) * _TIME_TO_MS[unit] / 1000,
        bytes_read=round(float(size) * _SIZE_TO_BYTES[size_unit]),
        socket_errors={kind: int(socket.group(i)) if socket else 0
                       for i, kind in enumerate(kinds, start=1)},
        error_responses=int(status.group(1)) if status else 0,
        raw=text,
        paths_sent=int(paths.group(1)) if paths else None,
        paths_most_per_thread=int(paths.group(2)) if paths else None,
    )


def _label(number: str) -> str:
    """ "50" for 50 and 50.0, "99.9" for 99.9."""
    return f"{float(number):g}"
