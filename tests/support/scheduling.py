"""How `make test` shares the suite between its two pytest-xdist workers: what one worker takes whole (a
scope) and in which order the scopes go out.

The order is the longest scope first, by the seconds each took when last measured (`scope_seconds.json` beside
this file, committed; a run of `make test` writes its own measure to .pytest_cache/miles/scope-seconds.json, which
the next run on that machine orders by). Each worker takes the next scope when it is free, so the long ones start
early and the many short ones fill in at the end: both workers end close together. In the order before (the
most tests first) a run of a minute (`test_learning`) started 85 s before the end on one worker.
A scope with no measure is estimated from what it holds."""
from __future__ import annotations

import json
import re
from pathlib import Path

COMMITTED_SECONDS = Path(__file__).with_name("scope_seconds.json")
LOCAL_SECONDS = Path(".pytest_cache") / "miles" / "scope-seconds.json"  # under the rootdir
# a scope never measured: an end-to-end module's runs take tens of seconds, a short test well under one
UNMEASURED_RUN_S, UNMEASURED_TEST_S = 30.0, 0.3

SESSION_RUNS = ("flow_run", "plain_run")  # tests/support/sessions.py: the runs that modules read, made once each


def scope_of(nodeid: str, root: Path) -> str:
    """What one worker takes whole: a test's module, so that the module's fixtures (its runs, its engines) are
    made once; or the session run the module reads, so that all its readers go to one worker and that run is
    made once in the whole suite. Read from the module's text: the controller collects nothing."""
    module = nodeid.split("::", 1)[0]
    try:
        text = (root / module).read_text()
    except OSError:
        return module
    arguments = {name.strip().split(":")[0].strip() for args in re.findall(r"def \w+\(([^)]*)\)", text)
                 for name in args.split(",")}
    return next((run for run in SESSION_RUNS if run in arguments), module)


def runs_training(scope: str, root: Path) -> bool:
    """Whether a scope holds an end-to-end run: a session run, or a module with `@pytest.mark.slow` tests."""
    if scope in SESSION_RUNS:
        return True
    try:
        return "pytest.mark.slow" in (root / scope).read_text()
    except OSError:
        return False


def read_seconds(path: Path) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def measured_seconds(root: Path) -> dict[str, float]:
    """Seconds per scope: this machine's last measure of it where there is one, else the committed one."""
    return {**read_seconds(COMMITTED_SECONDS), **read_seconds(root / LOCAL_SECONDS)}


def estimate(scope: str, tests: int, seconds: dict[str, float], root: Path) -> float:
    if scope in seconds:
        return seconds[scope]
    return UNMEASURED_RUN_S if runs_training(scope, root) else UNMEASURED_TEST_S * tests


def ordered(queue: list[tuple[str, dict]], root: Path,
            seconds: dict[str, float] | None = None) -> list[tuple[str, dict]]:
    """The longest scopes first (measured, or estimated); among equals, the most tests first."""
    seconds = measured_seconds(root) if seconds is None else seconds
    return sorted(queue, key=lambda item: (-estimate(item[0], len(item[1]), seconds, root), -len(item[1])))


class ScopeClock:
    """Sums the seconds of each scope's tests (set-up, call and tear-down) as the workers report them, and
    writes them for the next run's order (`cp .pytest_cache/miles/scope-seconds.json tests/support/scope_seconds.json`
to commit a new measure)."""

    def __init__(self, root: Path):
        self.root, self.seconds = root, {}

    def add(self, nodeid: str, duration: float) -> None:
        scope = scope_of(nodeid, self.root)
        self.seconds[scope] = self.seconds.get(scope, 0.0) + duration

    def write(self) -> Path | None:
        if not self.seconds:
            return None
        path = self.root / LOCAL_SECONDS
        path.parent.mkdir(parents=True, exist_ok=True)
        merged = {**read_seconds(path), **self.seconds}  # a run of some modules keeps the others' measures
        ranked = dict(sorted(((k, round(v, 1)) for k, v in merged.items()), key=lambda kv: -kv[1]))
        path.write_text(json.dumps(ranked, indent=1) + "\n")
        return path
