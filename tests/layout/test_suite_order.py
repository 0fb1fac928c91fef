"""How `make test` shares the suite between its two workers (tests/support/scheduling.py): a module, or the
session run it reads, goes whole to one worker; end-to-end runs go before short tests of as many tests."""
from __future__ import annotations

from pathlib import Path

from tests.support.scheduling import ordered, runs_training, scope_of

ROOT = Path(__file__).resolve().parents[2]


def test_a_module_goes_whole_and_a_session_runs_readers_go_together():
    assert scope_of("tests/engines/test_units.py::test_x", ROOT) == "tests/engines/test_units.py"
    assert scope_of("tests/training/test_loop.py::test_x", ROOT) == "plain_run"
    assert scope_of("tests/security/test_run_token.py::test_x[a]", ROOT) == "plain_run"
    assert scope_of("tests/orchestration/test_grpo_flow.py::test_x", ROOT) == "flow_run"
    assert scope_of("tests/no_such_module.py::test_x", ROOT) == "tests/no_such_module.py"


def test_end_to_end_runs_go_before_short_tests_of_as_many_tests():
    assert runs_training("flow_run", ROOT) and runs_training("tests/training/test_learning.py", ROOT)
    assert not runs_training("tests/tracking/test_secrets.py", ROOT)
    queue = [("tests/tracking/test_secrets.py", {"a": False}),  # collection order: the short one first
             ("tests/training/test_learning.py", {"b": False}),
             ("tests/engines/test_units.py", {str(i): False for i in range(3)}),
             ("tests/tracking/test_resume.py", {"c": False})]
    assert [scope for scope, _ in ordered(queue, ROOT)] == [
        "tests/engines/test_units.py",  # the most tests first
        "tests/training/test_learning.py",  # then, of one test each, the run of a minute and a half
        "tests/tracking/test_secrets.py", "tests/tracking/test_resume.py"]  # short ones last, in their order
