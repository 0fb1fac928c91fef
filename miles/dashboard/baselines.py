"""The dashboard's comparison: which run dirs may be baselines, and the run against the chosen ones.

Candidates are the `--baseline` dirs given to `miles dashboard` and the run's siblings (the other run
dirs beside it, each with a journal). A request names baselines by their listed path only, so the API
never reads a directory it did not list. The comparison is `miles compare`'s, with each run's curves
added for the overlaid charts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from miles.compare.comparison import compare
from miles.compare.curves import RunCurves, read_run, require_judged
from miles.compare.rules import DEFAULT_RULES, Rule
from miles.config import ConfigError
from miles.record.journal import JOURNAL_NAME, UnreadableRun

MAX_SIBLINGS = 200  # a parent folder with thousands of runs lists its newest only


class BadBaseline(ValueError):
    """A baseline the request names that is not a listed candidate, or cannot be read."""


@dataclass(frozen=True)
class Candidate:
    path: str
    name: str
    given: bool  # passed with --baseline (selected by default)

    def as_json(self) -> dict:
        return {"path": self.path, "name": self.name, "given": self.given}


def _is_run_dir(path: Path) -> bool:
    try:
        return path.is_dir() and (path / JOURNAL_NAME).is_file()
    except OSError:
        return False


def candidates(run_dir: Path, given: list[Path]) -> list[Candidate]:
    me = Path(run_dir).resolve()
    out = [Candidate(str(p), p.name or str(p), True) for p in given]
    seen = {Path(p).resolve() for p in given} | {me}
    try:
        siblings = [p for p in me.parent.iterdir() if p.resolve() not in seen and _is_run_dir(p)]
    except OSError:
        siblings = []
    siblings.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    out += [Candidate(str(p), p.name, False) for p in siblings[:MAX_SIBLINGS]]
    return out


def _curves_json(run: RunCurves) -> dict:
    """Each judged metric as {x, y} (non-finite values left out of the line; the verdicts name them)."""
    out = {}
    for key, points in run.curves.items():
        finite = [(s, v) for s, v in sorted(points.items()) if math.isfinite(v)]
        out[key] = {"x": [s for s, _ in finite], "y": [v for _, v in finite]}
    return out


def comparison(run_dir: Path, chosen: list[str], listed: list[Candidate],
               rules: tuple[Rule, ...] = DEFAULT_RULES) -> dict:
    paths = {c.path for c in listed}
    unknown = [c for c in chosen if c not in paths]
    if unknown:
        raise BadBaseline(f"baseline {unknown[0]!r:.200} is not one of the listed candidates (/api/baselines)")
    try:
        run = read_run(run_dir, rules)
        baselines = [require_judged(read_run(Path(c), rules, "baseline")) for c in dict.fromkeys(chosen)]
    except (ConfigError, UnreadableRun) as exc:
        raise BadBaseline(str(exc)) from None
    result = compare(run, baselines, rules)
    return {**result.as_json(), "curves": {r.source: _curves_json(r) for r in [run, *baselines]}}
