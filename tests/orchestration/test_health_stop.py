"""--on-red-flag stop through `miles train` (flows.train_command.main): the chunk is not retried, the flow run ends Failed
with the signal and why, the checkpoint of the flagged rollout is there, the grpo-health artifact and red-flag
event say the same, and the run's scorecard is still printed, published as `grpo-scorecard` and set as the
MLflow run's description."""
from __future__ import annotations

import asyncio

import pytest

from tests.support.prefect import read_events
from tests.support.flags import FLOW
from tests.support.prefect import task_runs_of


def flow_run_named(name: str):
    """The newest `grpo` flow run of that name (the flow names its runs after the run dir)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    async def read():
        async with get_client() as client:
            return await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])),
                                               sort=FlowRunSort.START_TIME_DESC, limit=1)

    (run,) = asyncio.run(read())
    return run


@pytest.mark.slow
def test_a_red_flag_stops_the_flow_with_a_checkpoint_a_failed_state_and_a_scorecard(prefect_api, tmp_path, capsys):
    from mlflow.tracking import MlflowClient
    from prefect.artifacts import Artifact

    from flows.train_command import main
    from miles.tracking.run_description import mlflow_run_id
    from miles.tracking.sinks.mlflow_sink import DESCRIPTION_TAG
    from miles.tracking.state import DeliveryState

    run_dir = tmp_path / f"red-flag-stop-{tmp_path.name}"  # a name no other test's flow run has
    # answers of two digits and an end token cannot fit in 2 tokens: truncated_ratio is red at rollout 0
    code = main([*FLOW, "--run-dir", str(run_dir), "--rollout-max-response-len", "2", "--on-red-flag", "stop",
                 "--use-mlflow"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "miles train: stopped: " in err and "truncated_ratio at rollout 0" in err
    # the terminal's scorecard of the stopped run: its red flag and the checkpoint it stopped at
    card = out[out.index(f"miles train: scorecard of {run_dir}"):]
    assert "truncated_ratio at rollout 0" in card and str(run_dir / "checkpoints" / "iter_0000000") in card

    flow_run = flow_run_named(run_dir.name)
    assert flow_run.state.is_failed()
    assert "truncated_ratio at rollout 0" in flow_run.state.message
    assert "stopped by --on-red-flag stop" in flow_run.state.message
    assert (run_dir / "checkpoints" / "iter_0000000" / "manifest.json").exists()
    chunks = [r for r in task_runs_of(flow_run.id) if r.name == "train_chunk[iter 0..1]"]
    assert len(chunks) == 1 and chunks[0].run_count == 1 and chunks[0].state.is_failed()  # not retried
    assert "`truncated_ratio` from rollout 0" in Artifact.get("grpo-health").data
    scorecard = Artifact.get("grpo-scorecard")
    assert f"## Scorecard of `{run_dir.name}`" in scorecard.data and "truncated_ratio at rollout 0" in scorecard.data
    # the MLflow run's description: what was trained, then the same card
    uri = DeliveryState.load(run_dir).sinks["mlflow"].spec.options["tracking_uri"]
    description = MlflowClient(tracking_uri=uri).get_run(mlflow_run_id(run_dir)).data.tags[DESCRIPTION_TAG]
    assert description.startswith("GRPO (fsdp) of ") and f"## Scorecard of `{run_dir.name}`" in description

    def flagged(events: list[dict]) -> bool:
        return any(e["resource"]["miles.signal"] == "truncated_ratio" for e in events)

    assert flagged(read_events("miles.health.red-flag", run_dir.name, until=flagged))


@pytest.mark.slow
def test_a_non_finite_step_stops_the_flow_once_with_a_scorecard(prefect_api, tmp_path, capsys):
    """Rewards that overflow make the first gradient norm non-finite: the step is refused, the chunk is not
    resubmitted (the same data and checkpoint would give the same), and `miles train` says why, exits 1 and
    prints the scorecard, which the flow also publishes."""
    from prefect.artifacts import Artifact

    from flows.train_command import main

    run_dir = tmp_path / f"non-finite-{tmp_path.name}"
    code = main([*FLOW, "--run-dir", str(run_dir), "--custom-rm-path", "tests.health.broken_rewards.huge"])
    out, err = capsys.readouterr()
    assert code == 1 and "miles train: stopped: " in err and "non-finite gradient norm" in err, err[-3000:]
    card = out[out.index(f"miles train: scorecard of {run_dir}"):]
    assert "rollouts       none trained" in card
    flow_run = flow_run_named(run_dir.name)
    assert flow_run.state.is_failed()
    chunks = [r for r in task_runs_of(flow_run.id) if r.name == "train_chunk[iter 0..1]"]
    assert len(chunks) == 1 and chunks[0].state.is_failed()  # not resubmitted
    assert f"## Scorecard of `{run_dir.name}`" in Artifact.get("grpo-scorecard").data
