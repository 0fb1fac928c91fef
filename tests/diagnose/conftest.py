"""The fixtures of the diagnose tests: real short runs made to hang or die (tests/diagnose/hanging_runs.py),
each closed at teardown; `hang_run`, one per module, is shared by the tests that can read the same run."""
from __future__ import annotations

import pytest

from tests.diagnose.hang_rewards import HANG_REWARD
from tests.diagnose.hanging_runs import SECRET_TOKEN, Run


@pytest.fixture
def start_run(tmp_path, base_model):
    runs = []

    def start(*flags) -> Run:
        run = Run(tmp_path / "run", list(flags), tmp_path / "hang")
        runs.append(run)
        return run
    yield start
    for run in runs:
        run.close()


@pytest.fixture(scope="module")
def hang_run(tmp_path_factory, base_model):
    """A run whose reward hangs while `hang_file` exists, with a secret admin token; shared by the module's
    tests in file order: one makes it hang and go on, a later one kills it (the run outlives neither)."""
    root = tmp_path_factory.mktemp("hang-run")
    run = Run(root / "run", ["--custom-rm-path", HANG_REWARD, "--router-admin-token", SECRET_TOKEN], root / "hang")
    yield run
    run.close()
