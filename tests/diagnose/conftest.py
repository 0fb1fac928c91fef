"""The fixtures of the diagnose tests: real short runs made to hang or die (tests/diagnose/hanging_runs.py),
each closed at teardown."""
from __future__ import annotations

import pytest

from tests.diagnose.hanging_runs import Run


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

