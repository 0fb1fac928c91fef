"""The GRPO flow end to end on a real Prefect server and real Ray: a failed chunk is resubmitted (one
retry layer), resumed from the checkpoint, visible on the Prefect API; --save-interval is honoured;
the journal holds one line per step."""
from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest
import ray

from miles.config import ConfigError, parse_config
from miles.record.timeline import read_spans
from tests.support.prefect import task_runs_of
from tests.support.runs import journal_steps


def names(runs) -> Counter:
    return Counter(r.name.rsplit("-", 1)[0] if r.name.startswith(("bring_up", "start_router", "launch_engine",
                                                                    "register_engine", "finish_run", "grpo"))
                   else r.name for r in runs)


@pytest.mark.slow
def test_a_raising_chunk_is_resubmitted_and_resumes_from_the_interval_checkpoint(run_grpo):
    state, run_dir = run_grpo("--inject-fault", "raise@1", "--save-interval", "1", "--keep-checkpoints", "10")
    assert state.is_completed(), state.message
    assert journal_steps(run_dir) == [0, 1, 2, 3]  # nothing lost, nothing doubled
    runs = task_runs_of(state.state_details.flow_run_id)
    attempts = sorted((r for r in runs if r.name == "train_chunk[0-2]"), key=lambda r: r.expected_start_time)
    # one retry layer: the flow resubmits the chunk (no Prefect retry inside it), and the API shows both
    assert [r.state.type.value for r in attempts] == ["FAILED", "COMPLETED"] and attempts[0].run_count == 1
    assert names(runs)["train_chunk[2-4]"] == 1 and names(runs)["finish_run"] == 1
    # --save-interval 1 with chunks of 2: a checkpoint after every rollout, not only at chunk ends
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [f"iter_000000{i}" for i in range(4)]
    assert not ray.is_initialized()


@pytest.mark.slow
def test_a_chunk_whose_worker_is_killed_is_resubmitted(run_grpo):
    from prefect.artifacts import Artifact

    baseline = Path(__file__).parents[1] / "dashboard" / "recorded_run"  # a real recorded run, as a baseline
    state, run_dir = run_grpo("--inject-fault", "kill@1", "--baseline-run-dirs", str(baseline))
    assert state.is_completed(), state.message
    assert journal_steps(run_dir) == [0, 1, 2, 3]
    attempts = sorted((r for r in task_runs_of(state.state_details.flow_run_id) if r.name == "train_chunk[0-2]"),
                      key=lambda r: r.expected_start_time)
    assert [r.state.type.value for r in attempts] == ["CRASHED", "COMPLETED"]
    # the run against its baseline reaches Prefect as the comparison artifact (miles compare's verdicts)
    compared = Artifact.get("grpo-compare").data
    assert "rollout/raw_reward" in compared and f"vs {baseline.name}" in compared, compared


# non-default values of every engine flag the embedded engine has, and two router flags
ENGINE_FLAGS = ["--engine-device", "cpu", "--engine-max-batch-size", "32", "--engine-cpu-threads", "2",
                "--engine-max-queued-requests", "999", "--context-length", "200"]
ROUTER_FLAGS = ["--router-policy", "round-robin", "--router-max-retries", "3"]


def settings_lines(log: Path) -> list[dict]:
    """The effective-settings line each launch of a service wrote first (a relaunch appends its own)."""
    return [json.loads(line)["settings"] for line in log.read_text().splitlines() if line.startswith('{"service"')]


@pytest.mark.slow
def test_a_killed_engine_is_relaunched_and_reregistered_and_every_engine_flag_reaches_the_engines(run_grpo):
    state, run_dir = run_grpo("--rollout-num-engines", "2", "--inject-fault", "kill-engine@1",
                              *ENGINE_FLAGS, *ROUTER_FLAGS)
    assert state.is_completed(), state.message
    assert journal_steps(run_dir) == [0, 1, 2, 3]
    counts = names(task_runs_of(state.state_details.flow_run_id))
    # two engines launched and registered at start, engine 0 once more after it was killed
    assert counts["launch_engine"] == 3 and counts["register_engine"] == 3
    given = parse_config([*ENGINE_FLAGS, *ROUTER_FLAGS])
    logs = run_dir / "logs"
    engine_launches = settings_lines(logs / "engine-0.log") + settings_lines(logs / "engine-1.log")
    assert len(engine_launches) == 3  # engine 0 twice (relaunched), engine 1 once
    for launch in engine_launches:
        assert {k: launch[k] for k in dataclasses.asdict(given.engine)} == dataclasses.asdict(given.engine)
    (router,) = settings_lines(logs / "router.log")
    assert router["router_policy"] == "round-robin" and router["router_max_retries"] == 3
    # the flow's engines write their decoding to the run's timeline too (engine 0 keeps its port and lane)
    spans = read_spans(run_dir / "timeline.jsonl")
    assert len({s.lane for s in spans if s.lane.startswith("engine ") and s.name == "decode"}) == 2
    # ... and so does the flow's router: both engines registered (engine 0's re-registration found it there),
    # its bursts of requests
    assert len([s for s in spans if s.lane == "router" and s.name == "add_worker"]) == 2
    assert sum(s.args["requests"] for s in spans if s.lane == "router" and s.name == "proxy") >= 4
    assert {s.rollout_id for s in spans if s.lane == "trainer" and s.name == "rollout"} == {0, 1, 2, 3}


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
