"""Fixtures of the orchestration tests: run the flow on the tiny config."""
from __future__ import annotations

import pytest

from tests.support.flags import FLOW


@pytest.fixture
def run_grpo(prefect_api, tmp_path):
    """Run the flow in this process against the session's Prefect server; returns (state, run_dir)."""
    from flows.grpo import grpo

    def run(*flags: str):
        run_dir = tmp_path / "run"
        state = grpo(flags=[*FLOW, "--run-dir", str(run_dir), *flags], return_state=True)
        return state, run_dir

    return run
