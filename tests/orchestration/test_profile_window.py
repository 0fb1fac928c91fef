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
from tests.support.sessions import FLOW_RUN_TIMEOUT_S, SessionFlow


def artifacts_of(task_run_id) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterTaskRunId

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(task_run_id=ArtifactFilterTaskRunId(any_=[task_run_id])))

    return asyncio.run(read())


@pytest.mark.slow
@pytest.mark.timeout(FLOW_RUN_TIMEOUT_S)
def test_profile_window_task_profiles_its_rollouts_and_leaves_a_summary(flow_run):
    # the session's flow (tests/support/sessions.py) profiles rollout 4 (--profile-step-start 4, end 5)
    start, end = SessionFlow.PROFILE
    window = f"{start}-{end}"
    run_dir = flow_run.run_dir
    assert flow_run.code == 0 and flow_run.flow_run.state.is_completed(), flow_run.flow_run.state
    assert journal_steps(run_dir) == list(range(SessionFlow.NUM_ROLLOUT))
    task = next(r for r in task_runs_of(flow_run.flow_run.id) if r.name == f"profile_window[iter {start}]")
    (artifact,) = [a for a in artifacts_of(task.id) if a.type == "table"]
    assert artifact.key == f"profile-window-iter-{start}"  # named as the task is (N18)
    rows = json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data
    assert {row["target"] for row in rows} == {"train_overall", "train_actor", "rollout"}
    assert all(row["rollouts"] == window for row in rows)

    profiler = run_dir / "profiler"
    with gzip.open(profiler / f"train_overall_rollouts_{window}" / "rank0.pt.trace.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    names = {e["name"] for e in events if e.get("cat") == "user_annotation"}
    assert {f"ProfilerStep#{start}", "rollout", "log_probs", "actor_train", "update_weights", "checkpoint"} <= names
    assert not any(n.startswith("ProfilerStep#") and n != f"ProfilerStep#{start}" for n in names)
    assert (profiler / f"rollout_rollouts_{window}" / "engine0-TP-0.trace.json.gz").exists()
    assert isinstance(json.loads((profiler / "ray-timeline.json").read_text()), list)
    store = run_dir.parent / "mlartifacts"  # the MLflow store beside the run dir, shared by the runs there
    uploaded = [p.relative_to(store) for p in store.rglob("*.pt.trace.json.gz")]
    assert any(str(p).endswith(f"profiler/train_actor_rollouts_{window}/rank0.pt.trace.json.gz") for p in uploaded)
    lines = [json.loads(line) for line in (profiler / "summaries.jsonl").read_text().splitlines()]
    assert {(s["target"], s["start"], s["end"]) for s in lines} == {
        ("train_overall", start, end), ("train_actor", start, end), ("rollout", start, end)}
