"""The `profile_window` task of the GRPO flow profiles its rollouts for real: rank traces with the
trainer's spans, an engine trace per engine (found through the router), the Ray timeline, and the
window's summary as the task's table artifact, the traces as MLflow artifacts."""
from __future__ import annotations

import asyncio
import gzip
import json

import pytest

from tests.support.prefect import task_runs_of
from tests.support.runs import journal_steps


def artifacts_of(task_run_id) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterTaskRunId

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(task_run_id=ArtifactFilterTaskRunId(any_=[task_run_id])))

    return asyncio.run(read())


@pytest.mark.slow
def test_profile_window_task_profiles_its_rollouts_and_leaves_a_summary(run_grpo):
    state, run_dir = run_grpo("--use-pytorch-profiler", "--profile-step-start", "1", "--profile-step-end", "2",
                              "--profile-target", "train_overall", "train_actor", "--profile-rollout",
                              "--ray-timeline", "--use-mlflow")
    assert state.is_completed(), state.message
    assert journal_steps(run_dir) == [0, 1, 2, 3]
    task = next(r for r in task_runs_of(state.state_details.flow_run_id) if r.name == "profile_window[1-2]")
    (artifact,) = [a for a in artifacts_of(task.id) if a.type == "table"]
    rows = json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data
    assert {row["target"] for row in rows} == {"train_overall", "train_actor", "rollout"}
    assert all(row["rollouts"] == "1-2" for row in rows)

    profiler = run_dir / "profiler"
    with gzip.open(profiler / "train_overall_rollouts_1-2" / "rank0.pt.trace.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    names = {e["name"] for e in events if e.get("cat") == "user_annotation"}
    assert {"ProfilerStep#1", "rollout", "log_probs", "actor_train", "update_weights", "checkpoint"} <= names
    assert not any(n.startswith("ProfilerStep#") and n != "ProfilerStep#1" for n in names)
    assert (profiler / "rollout_rollouts_1-2" / "engine0-TP-0.trace.json.gz").exists()
    assert isinstance(json.loads((profiler / "ray-timeline.json").read_text()), list)
    uploaded = [p.relative_to(run_dir / "mlartifacts") for p in (run_dir / "mlartifacts").rglob("*.pt.trace.json.gz")]
    assert any(str(p).endswith("profiler/train_actor_rollouts_1-2/rank0.pt.trace.json.gz") for p in uploaded)
    lines = [json.loads(line) for line in (profiler / "summaries.jsonl").read_text().splitlines()]
    assert {(s["target"], s["start"], s["end"]) for s in lines} == {
        ("train_overall", 1, 2), ("train_actor", 1, 2), ("rollout", 1, 2)}
