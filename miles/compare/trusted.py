"""A history of trusted runs: one compact JSON per run that passed, holding only its judged curves.

`DIR/<run name>.json` is `{"format", "run", "source", "added", "reached", "curves": {key: [[step, value],
...]}}`, small enough to live in git (a default 8-rollout run: a few KB); `DIR/rules.json`, when present,
holds the rules this history is judged by (else the defaults). Nothing else in DIR is read.
"""
from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

from miles.compare.curves import RunCurves, require_judged
from miles.compare.rules import DEFAULT_RULES, Rule, load_rules
from miles.config import ConfigError
from miles.record.files import write_atomic
from miles.record.journal import UnreadableRun

FORMAT = "miles-trusted-run/1"
RULES_NAME = "rules.json"


def history_dir(path: Path | str, flag: str = "--history", creating: bool = False) -> Path:
    """The history directory named by `flag`. It must exist unless `creating` (--history-add makes it):
    a mistyped name would otherwise be an empty history, a cold start that passes any run."""
    if "://" in str(path) or str(path).startswith("mlflow:"):
        raise ConfigError(flag, f"{path} is a URI: a history is a directory of trusted-run records (an MLflow "
                                f"experiment is not read as one; see docs/user-guide/compare.md)")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(flag, f"{path} is not a directory")
    if not path.exists() and not creating:
        raise ConfigError(flag, f"{path} does not exist (the first `--history-add` of a run that passed makes it)")
    return path


def history_rules(directory: Path) -> tuple[Rule, ...]:
    path = Path(directory) / RULES_NAME
    return load_rules(path, f"{path}") if path.exists() else DEFAULT_RULES


def record_of(run: RunCurves) -> dict:
    return {"format": FORMAT, "run": run.name, "source": run.source, "added": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                       time.gmtime()),
            "reached": run.reached,
            "curves": {k: [[s, v] for s, v in sorted(points.items())] for k, points in sorted(run.curves.items())}}


def _file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".") or "run"


def add_trusted(directory: Path, run: RunCurves) -> Path:
    """Write the run's record (the same run added again replaces its record; another run of the same
    name gets a numbered name)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stem, n = _file_name(run.name), 1
    path = directory / f"{stem}.json"
    while (path.is_symlink() or path.exists()) and _source_of(path) != run.source:
        n += 1
        path = directory / f"{stem}-{n}.json"
    if path.is_symlink():
        raise UnreadableRun(f"{path} is a symbolic link: not replaced (a record is a regular file)")
    if not all(math.isfinite(v) for points in run.curves.values() for v in points.values()):
        raise ValueError(f"{run.source} has a value that is not finite: not a trusted run")
    # never through a planted `<run>.tmp` link (probe N37): write_atomic's temporary name is fresh
    text = json.dumps(record_of(run), indent=None, separators=(",", ":"), allow_nan=False) + "\n"
    return write_atomic(path, text, mode=0o644)  # a record to commit, readable as any other in git


def _source_of(path: Path) -> str | None:
    if path.is_symlink():
        return None
    try:
        return json.loads(path.read_bytes()).get("source")
    except (OSError, ValueError, AttributeError):
        return None


def read_record(path: Path) -> RunCurves:
    """One trusted run; UnreadableRun naming the file and the field when it is not a record."""
    try:
        raw = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:
        raise UnreadableRun(f"cannot read {path}: {' '.join(str(exc).split())[:200]}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise UnreadableRun(f"{path}: not a trusted-run record (format {FORMAT!r})")
    curves, reached = raw.get("curves"), raw.get("reached")
    if not isinstance(curves, dict) or not isinstance(reached, dict):
        raise UnreadableRun(f"{path}: curves and reached must be objects")
    out: dict[str, dict[int, float]] = {}
    for key, points in curves.items():
        if not isinstance(points, list) or not all(_is_point(p) for p in points):
            raise UnreadableRun(f"{path}: curves[{key!r:.60}] is not a list of [step, finite value]")
        out[key] = {int(s): float(v) for s, v in points}
    if not all(isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**53 for v in reached.values()):
        raise UnreadableRun(f"{path}: reached must map step axes to integers")
    name = raw.get("run") if isinstance(raw.get("run"), str) else path.stem
    return require_judged(RunCurves(name, str(path), out, dict(reached)), "trusted run")


def _is_point(p: object) -> bool:
    """[step, value]: an integer step within 2**53 and a finite number (an integer past the float range,
    a 401-digit one, is none: probe N36)."""
    return (isinstance(p, list) and len(p) == 2 and isinstance(p[0], int) and not isinstance(p[0], bool)
            and abs(p[0]) < 2**53 and isinstance(p[1], (int, float)) and not isinstance(p[1], bool)
            and _finite(p[1]))


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large to convert to float
        return False


def read_trusted(directory: Path) -> list[RunCurves]:
    directory = Path(directory)
    if not directory.is_dir():
        return []
    files = sorted(p for p in directory.glob("*.json") if p.name != RULES_NAME)
    for p in files:
        if p.is_symlink():  # a history meant to live in git can carry a planted link to any file
            raise UnreadableRun(f"{p} is a symbolic link: a trusted-run record is a regular file in the history")
        if not p.is_file():
            raise UnreadableRun(f"{p} is not a regular file")
    return [read_record(p) for p in files]
