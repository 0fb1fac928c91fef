"""How `make test` shares the suite between its two pytest-xdist workers: what one worker takes whole (a
scope) and in which order the scopes go out."""
from __future__ import annotations

import re
from pathlib import Path

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


def ordered(queue: list[tuple[str, dict]], root: Path) -> list[tuple[str, dict]]:
    """The scopes with the most tests first (xdist's order) and, among scopes of as many tests, those with
    end-to-end runs first: the suite then ends on short tests on both workers. In xdist's order (collection
    order among equals) it ended on `training/test_learning.py`, one worker's run of a minute and a half
    while the other had nothing left."""
    return sorted(queue, key=lambda item: (-len(item[1]), not runs_training(item[0], root)))
