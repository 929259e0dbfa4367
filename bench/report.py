"""Results: one scenario's numbers per target, the ratios, the table and the JSON file."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hold import HoldStats, combine
from wrk import Report

TARGETS = ("bare", "gateway")
# The bare app making the scenario's database statements (run.py --floor, floor.py).
FLOOR = "floor"


@dataclass(slots=True)
class TargetResult:
    """Every measured wrk run against one target (and its held requests, if any)."""

    runs: list[Report] = field(default_factory=list)
    holds: list[HoldStats] = field(default_factory=list)

    @property
    def requests_per_second(self) -> float:
        """Mean over the runs."""
        return statistics.fmean(run.requests_per_second for run in self.runs)

    @property
    def p50_ms(self) -> float:
        """Mean of the runs' medians (wrk reports percentiles, not mergeable histograms)."""
        return statistics.fmean(run.p50_ms for run in self.runs)

    @property
    def p99_ms(self) -> float:
        """Mean of the runs' 99th percentiles."""
        return statistics.fmean(run.p99_ms for run in self.runs)

    @property
    def spread(self) -> float | None:
        """How far the runs' requests/s lie apart, relative to their mean: the noise.

        None for a single run, which says nothing about noise.
        """
        rates = [run.requests_per_second for run in self.runs]
        if len(rates) < 2:
            return None
        return (max(rates) - min(rates)) / statistics.fmean(rates)

    @property
    def problems(self) -> str:
        """Failed requests over all runs, or "-"."""
        errors = sum(run.error_responses for run in self.runs)
        found = [f"{errors} responses >= 400"] if errors else []
        for kind in ("connect", "read", "write", "timeout"):
            count = sum(run.socket_errors[kind] for run in self.runs)
            if count:
                found.append(f"{count} socket {kind} errors")
        return ", ".join(found) or "-"

    def as_json(self) -> dict[str, Any]:
        """Summary and every run, as plain JSON values."""
        result: dict[str, Any] = {
            "requests_per_second": round(self.requests_per_second, 2),
            "p50_ms": round(self.p50_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "spread": None if self.spread is None else round(self.spread, 4),
            "problems": self.problems,
            "runs": [run.as_json() for run in self.runs],
        }
        if self.holds:
            result["held"] = combine(self.holds).as_json()
            result["held_per_run"] = [stats.as_json() for stats in self.holds]
        return result


@dataclass(slots=True)
class ScenarioResult:
    """One scenario: both targets' numbers, or why it could not be measured."""

    name: str
    description: str
    method: str
    path: str
    targets: dict[str, TargetResult] = field(
        default_factory=lambda: {name: TargetResult() for name in TARGETS})
    error: str | None = None

    @property
    def measured(self) -> bool:
        """Every target has at least one run."""
        return self.error is None and all(t.runs for t in self.targets.values())

    @property
    def has_floor(self) -> bool:
        """The floor was measured beside the other two."""
        return FLOOR in self.targets

    def ratios(self, against: str = "bare") -> dict[str, float]:
        """gateway/``against`` for requests/s (below 1: slower) and latencies (above 1: slower)."""
        gateway, other = self.targets["gateway"], self.targets[against]
        return {
            "requests_per_second": gateway.requests_per_second / other.requests_per_second,
            "p50_ms": gateway.p50_ms / other.p50_ms,
            "p99_ms": gateway.p99_ms / other.p99_ms,
        }

    def round_ratios(self, against: str = "bare") -> list[float]:
        """gateway/``against`` requests/s of each round, whose runs came one after the other.

        On a shared machine, someone else's burst of work slows whichever
        target runs at that moment: the rounds' ratios lying far apart say
        that the ratio of the means above is no better than that range.
        """
        gateway, other = self.targets["gateway"].runs, self.targets[against].runs
        return [g.requests_per_second / o.requests_per_second
                for g, o in zip(gateway, other, strict=True)]

    def as_json(self) -> dict[str, Any]:
        """The scenario as plain JSON values.

        Only method and path of the request: a later scenario's headers carry
        a bearer token, which has no business in a results file.
        """
        result: dict[str, Any] = {
            "name": self.name, "description": self.description,
            "request": {"method": self.method, "path": self.path}, "error": self.error,
        }
        if self.measured:
            result["targets"] = {name: t.as_json() for name, t in self.targets.items()}
            result["ratio_gateway_to_bare"] = {k: round(v, 4) for k, v in self.ratios().items()}
            result["ratio_per_round"] = [round(r, 4) for r in self.round_ratios()]
            if self.has_floor:
                result["ratio_gateway_to_floor"] = {
                    k: round(v, 4) for k, v in self.ratios(FLOOR).items()}
                result["ratio_to_floor_per_round"] = [
                    round(r, 4) for r in self.round_ratios(FLOOR)]
        return result


# --- printing -------------------------------------------------------------------

_COLUMNS = ("scenario", "target", "req/s", "spread", "p50 ms", "p99 ms", "held", "problems")
_TEXT_COLUMNS = (0, 1, 6, 7)


def header(facts: dict[str, str]) -> str:
    """The machine and load facts, one per line, aligned."""
    width = max(map(len, facts))
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in facts.items())


def table(results: list[ScenarioResult]) -> str:
    """The results table: one row per target, then the ratios gateway/bare (and /floor)."""
    rows: list[tuple[str, ...]] = [_COLUMNS]
    notes: list[str] = []
    for result in results:
        rows += _scenario_rows(result)
        notes += _held_notes(result)
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    # Text columns to the left, numbers to the right.
    lines = ["  ".join(cell.ljust(w) if i in _TEXT_COLUMNS else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip()
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines + (["", *notes] if notes else []))


def _scenario_rows(result: ScenarioResult) -> list[tuple[str, ...]]:
    if not result.measured:
        reason = (result.error or "not measured").splitlines()[0]
        return [(result.name, "FAILED", "", "", "", "", "", reason)]
    rows: list[tuple[str, ...]] = []
    for name, target in result.targets.items():
        spread = "-" if target.spread is None else f"{target.spread:.1%}"
        rows.append(("" if rows else result.name, name,
                     f"{target.requests_per_second:,.0f}", spread,
                     f"{target.p50_ms:.2f}", f"{target.p99_ms:.2f}", _held_cell(target),
                     target.problems))
    for against in ("bare", FLOOR) if result.has_floor else ("bare",):
        ratios = result.ratios(against)
        rows.append(("", f"gateway/{against}", f"{ratios['requests_per_second']:.2f}x",
                     _round_range(result.round_ratios(against)),
                     f"{ratios['p50_ms']:.2f}x", f"{ratios['p99_ms']:.2f}x", "", ""))
    return rows


def _round_range(ratios: list[float]) -> str:
    """The rounds' ratios as "lowest-highest", or "-" for a single round."""
    if len(ratios) < 2:
        return "-"
    return f"{min(ratios):.2f}-{max(ratios):.2f}"


def _held_cell(target: TargetResult) -> str:
    """The held requests in short: answered as expected of those sent, and their mean time.

    Over all rounds. For a long-poll nothing completes, every answer should
    take the whole wait: a shorter mean means some were answered at once.
    """
    if not target.holds:
        return "-"
    stats = combine(target.holds)
    cell = f"{stats.answered}/{stats.sent} ok"
    if stats.mean_answer_s is not None:
        cell += f", {stats.mean_answer_s:.1f} s"
    failed = sum(stats.unexpected.values()) + sum(stats.errors.values()) + stats.open_at_stop
    return cell + (f", {failed} not" if failed else "")


def _held_notes(result: ScenarioResult) -> list[str]:
    if not result.measured or not result.targets["gateway"].holds:
        return []
    return [f"{result.name}, held requests on {name}: {combine(target.holds).summary()}"
            for name, target in result.targets.items()]


def write_json(path: Path, facts: dict[str, Any], config: dict[str, Any],
               results: list[ScenarioResult]) -> None:
    """Everything measured, with the facts needed to compare it with another run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "facts": facts,
        "gunicorn_config": config,
        "scenarios": [result.as_json() for result in results],
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
