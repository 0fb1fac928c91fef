"""Helpers of the orchestration tests: run the flow on the tiny config and read its runs back."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

TINY = ["--num-rollout", "4", "--rollout-batch-size", "8", "--n-samples-per-prompt", "4", "--chunk-size", "2",
        "--eval-interval", "none", "--task-retry-delay", "0"]


def task_runs_of(flow_run_id) -> list:
    """Every task run of a flow run and its subflows, read back from the Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            ids, frontier = [flow_run_id], [flow_run_id]
            while frontier:
                children = await client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(parent_flow_run_id={"any_": frontier}))
                frontier = [c.id for c in children]
                ids += frontier
            return await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))

    return asyncio.run(read())


def journal_steps(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [int(json.loads(line)["rollout/step"]) for line in lines if line.strip()]


@pytest.fixture
def run_grpo(prefect_api, tmp_path):
    """Run the flow in this process against the session's Prefect server; returns (state, run_dir)."""
    from flows.grpo import grpo

    def run(*flags: str):
        run_dir = tmp_path / "run"
        state = grpo(flags=[*TINY, "--run-dir", str(run_dir), *flags], return_state=True)
        return state, run_dir

    return run
