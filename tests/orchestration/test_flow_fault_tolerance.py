"""Engine supervision in the Prefect flow (`miles train --use-fault-tolerance`): an engine SIGSTOPped as a
rollout starts is found hung by the chunk's supervisor, killed through its Ray actor, relaunched on its
port and readmitted at the current weights while the chunk goes on: no chunk fails or is resubmitted,
every rollout is in the journal once, and each state change is a Prefect event. The trainer is Megatron
split in two pipeline stages (issue 50: `miles train` with PP > 1), so the relaunched engine is readmitted
at weights gathered from both stages, and its log-probs still agree with the trainer's."""
from __future__ import annotations

import json

import pytest

from miles.record.journal import read_journal
from miles.record.timeline import read_spans
from tests.support.prefect import read_events
from tests.support.prefect import task_runs_of
from tests.support.runs import journal_steps

# two pipeline stages on 2 ranks: each stage pushes its own layers, and every rollout's log-probs must
# agree with the engine's as the default run's do
PIPELINE = ["--train-backend", "megatron", "--actor-num-gpus-per-node", "2",
            "--pipeline-model-parallel-size", "2"]
FAST = ["--engine-health-interval", "0.5", "--engine-health-timeout", "1", "--engine-hung-checks", "3",
        "--engine-restart-backoff", "0.2", "--engine-wait-timeout", "400"]


@pytest.mark.slow
def test_a_stopped_engine_is_healed_inside_the_chunk(run_grpo):
    state, run_dir = run_grpo("--rollout-num-engines", "2", "--use-fault-tolerance",
                              "--inject-fault", "stop-engine:1@1", *PIPELINE, *FAST)
    assert state.is_completed(), state.message
    assert journal_steps(run_dir) == [0, 1, 2, 3]  # nothing lost, nothing doubled
    # the report links the flow run that trains (the subflow), not only the parent Prefect prints first
    training = state.result().links["prefect-training-run"]
    assert "/runs/flow-run/" in training and str(state.state_details.flow_run_id) not in training
    chunks = [r for r in task_runs_of(state.state_details.flow_run_id) if r.name.startswith("train_chunk[")]
    assert sorted(r.name for r in chunks) == ["train_chunk[iter 0..1]", "train_chunk[iter 2..3]"]  # none resubmitted
    assert all(r.state.is_completed() and r.run_count == 1 for r in chunks)
    lines = [ln for ln in read_journal(run_dir / "metrics.jsonl") if ln.rollout_id >= 0]
    assert sum(ln.metrics["rollout/engine_restarts"] for ln in lines) == 1
    assert all(ln.metrics["train/train_rollout_logprob_abs_diff"] <= 1e-3 for ln in lines)
    last = sorted((run_dir / "checkpoints").glob("iter_*"))[-1]  # the layout the trainer ran, as it saved it
    assert json.loads((last / "trainer_state.json").read_text())["parallel"] == {"tp": 1, "pp": 2, "dp": 1}
    spans = [s for s in read_spans(run_dir / "timeline.jsonl") if s.lane == "engines"]
    down = [s for s in spans if s.name == "engine_down"]
    assert [s.args["engine"] for s in down] == [1] and down[0].args["reason"].startswith("hung")
    (restart,) = [s for s in spans if s.name == "engine_restart"]
    assert restart.args["engine"] == 1 and 0 <= restart.args["weight_version"] <= 4
    events = read_events("miles.engines.engine_restart", run_dir.name)
    assert [e["resource"]["miles.engine"] for e in events] == ["1"]
    assert read_events("miles.engines.engine_down", run_dir.name)[0]["payload"]["reason"].startswith("hung")
