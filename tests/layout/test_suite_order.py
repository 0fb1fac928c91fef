"""How `make test` shares the suite between its two workers (tests/support/scheduling.py): a module, or the
session run it reads, goes whole to one worker; the longest go out first, by their last measured seconds."""
from __future__ import annotations

from pathlib import Path

from tests.support.scheduling import (COMMITTED_SECONDS, SESSION_RUNS, ScopeClock, measured_seconds, ordered,
                                      read_seconds, runs_training, scope_of)

ROOT = Path(__file__).resolve().parents[2]


def test_a_module_goes_whole_and_a_session_runs_readers_go_together():
    assert scope_of("tests/engines/test_units.py::test_x", ROOT) == "tests/engines/test_units.py"
    assert scope_of("tests/training/test_loop.py::test_x", ROOT) == "plain_run"
    assert scope_of("tests/security/test_run_token.py::test_x[a]", ROOT) == "plain_run"
    assert scope_of("tests/orchestration/test_grpo_flow.py::test_x", ROOT) == "flow_run"
    assert scope_of("tests/no_such_module.py::test_x", ROOT) == "tests/no_such_module.py"


def test_the_longest_scopes_go_first_measured_or_estimated():
    assert runs_training("flow_run", ROOT) and runs_training("tests/training/test_learning.py", ROOT)
    assert not runs_training("tests/tracking/test_secrets.py", ROOT)
    seconds = {"tests/engines/test_units.py": 4.0, "tests/training/test_learning.py": 60.0}
    queue = [("tests/tracking/test_secrets.py", {"a": False}),  # not measured, short: 0.3 s a test
             ("tests/engines/test_units.py", {str(i): False for i in range(3)}),
             ("tests/training/test_learning.py", {"b": False}),
             ("tests/orchestration/test_deploy.py", {"c": False})]  # not measured, trains: 30 s
    assert [scope for scope, _ in ordered(queue, ROOT, seconds)] == [
        "tests/training/test_learning.py", "tests/orchestration/test_deploy.py", "tests/engines/test_units.py",
        "tests/tracking/test_secrets.py"]


def test_the_committed_measure_names_scopes_that_exist():
    seconds = read_seconds(COMMITTED_SECONDS)
    assert len(seconds) > 100 and all(v >= 0 for v in seconds.values())
    for scope in seconds:
        assert scope in SESSION_RUNS or (ROOT / scope).exists(), scope


def test_a_run_writes_its_measure_and_the_next_orders_by_it(tmp_path):
    clock = ScopeClock(tmp_path)
    clock.add("tests/a.py::test_x", 1.5)
    clock.add("tests/a.py::test_y", 2.0)
    clock.write()
    assert measured_seconds(tmp_path)["tests/a.py"] == 3.5
    later = ScopeClock(tmp_path)  # a run of other modules keeps this one's measure
    later.add("tests/b.py::test_z", 9.0)
    later.write()
    assert {k: measured_seconds(tmp_path)[k] for k in ("tests/a.py", "tests/b.py")} == {"tests/a.py": 3.5,
                                                                                          "tests/b.py": 9.0}
    committed = read_seconds(COMMITTED_SECONDS)
    assert measured_seconds(tmp_path).keys() >= committed.keys()  # the committed measure for the rest
