"""The GRPO flow end to end on a real Prefect server and real Ray: faults are retried, resumed
from the checkpoint, visible on the Prefect API, and the journal holds one line per step."""
from __future__ import annotations

from collections import Counter

import pytest
import ray

from miles.config import ConfigError
from tests.orchestration.conftest import journal_steps, task_runs_of


def names(runs) -> Counter:
    return Counter(r.name.rsplit("-", 1)[0] if r.name.startswith(("bring_up", "start_router", "launch_engine",
                                                                    "register_engine", "finish_run", "grpo"))
                   else r.name for r in runs)


@pytest.mark.slow
def test_a_raising_chunk_is_retried_and_resumes(run_grpo):
    state, run_dir = run_grpo("--inject-fault", "raise@1")
    assert state.is_completed(), state.message
    assert journal_steps(run_dir) == [0, 1, 2, 3]  # nothing lost, nothing doubled
    runs = task_runs_of(state.state_details.flow_run_id)
    chunk = next(r for r in runs if r.name == "train_chunk[0-2]")
    assert chunk.state.is_completed() and chunk.run_count == 2  # Prefect's own retry, on the API
    assert names(runs)["train_chunk[2-4]"] == 1 and names(runs)["finish_run"] == 1
    assert not ray.is_initialized()


@pytest.mark.slow
def test_a_chunk_whose_worker_is_killed_is_resubmitted(run_grpo):
    state, run_dir = run_grpo("--inject-fault", "kill@1")
    assert state.is_completed(), state.message
    assert journal_steps(run_dir) == [0, 1, 2, 3]
    attempts = sorted((r for r in task_runs_of(state.state_details.flow_run_id) if r.name == "train_chunk[0-2]"),
                      key=lambda r: r.expected_start_time)
    assert [r.state.type.value for r in attempts] == ["CRASHED", "COMPLETED"]


@pytest.mark.slow
def test_a_killed_engine_is_relaunched_and_reregistered(run_grpo):
    state, run_dir = run_grpo("--rollout-num-engines", "2", "--inject-fault", "kill-engine@1")
    assert state.is_completed(), state.message
    assert journal_steps(run_dir) == [0, 1, 2, 3]
    counts = names(task_runs_of(state.state_details.flow_run_id))
    # two engines launched and registered at start, engine 0 once more after it was killed
    assert counts["launch_engine"] == 3 and counts["register_engine"] == 3


def test_unreachable_ray_address_fails_before_any_engine(run_grpo):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    state, _ = run_grpo("--ray-address", address, "--task-retries", "0")
    assert state.is_failed()
    with pytest.raises(ConfigError, match="--ray-address: cannot reach a Ray cluster"):
        state.result()
    counts = names(task_runs_of(state.state_details.flow_run_id))
    assert counts["launch_engine"] == 0 and counts["start_router"] == 0


def test_bad_flag_fails_the_flow_before_the_cluster(run_grpo):
    state, _ = run_grpo("--chunk-size", "0")
    assert state.is_failed()
    with pytest.raises(ConfigError, match="--chunk-size: must be >= 1"):
        state.result()
    assert names(task_runs_of(state.state_details.flow_run_id))["bring_up_cluster"] == 0
