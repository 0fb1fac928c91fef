"""--on-red-flag stop in the flow: the chunk is not retried, the flow run ends Failed with the signal and why,
the checkpoint of the flagged rollout is there, and the grpo-health artifact and red-flag event say the same."""
from __future__ import annotations

import pytest

from miles.health import RedFlagStop
from tests.health.test_prefect_health import read_events
from tests.orchestration.conftest import task_runs_of


@pytest.mark.slow
def test_a_red_flag_stops_the_flow_with_a_checkpoint_and_a_failed_state(run_grpo):
    from prefect.artifacts import Artifact

    # answers of two digits and an end token cannot fit in 2 tokens: truncated_ratio is red at rollout 0
    state, run_dir = run_grpo("--rollout-max-response-len", "2", "--on-red-flag", "stop")
    assert state.is_failed()
    assert "truncated_ratio at rollout 0" in state.message and "stopped by --on-red-flag stop" in state.message
    with pytest.raises(RedFlagStop, match="truncated_ratio at rollout 0"):
        state.result()
    assert (run_dir / "checkpoints" / "iter_0000000" / "manifest.json").exists()
    chunks = [r for r in task_runs_of(state.state_details.flow_run_id) if r.name == "train_chunk[0-2]"]
    assert len(chunks) == 1 and chunks[0].run_count == 1 and chunks[0].state.is_failed()  # not retried
    assert "`truncated_ratio` from rollout 0" in Artifact.get("grpo-health").data
    def flagged(events: list[dict]) -> bool:
        return any(e["resource"]["miles.signal"] == "truncated_ratio" for e in events)

    assert flagged(read_events("miles.health.red-flag", "run", until=flagged))
