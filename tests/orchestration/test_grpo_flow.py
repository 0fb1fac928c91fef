"""The GRPO flow end to end on a real Prefect server and real Ray: a failed chunk is resubmitted (one
retry layer), resumed from the checkpoint, visible on the Prefect API; --save-interval is honoured;
the journal holds one line per step. The slow checks read the session's flow (`flow_run`)."""
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
from tests.support.sessions import FLOW_RUN_TIMEOUT_S, FlowRun, SessionFlow
from tests.support.runs import journal_steps


def names(runs) -> Counter:
    return Counter(r.name.rsplit("-", 1)[0] if r.name.startswith(("bring_up", "start_router", "launch_engine",
                                                                    "register_engine", "finish_run", "grpo"))
                   else r.name for r in runs)


def attempts_of(flow_run) -> dict[str, list[str]]:
    """The state of each attempt of each chunk task, in the order they started."""
    runs = sorted(task_runs_of(flow_run.id), key=lambda r: r.expected_start_time)
    chunks = {}
    for r in runs:
        if r.name.startswith(("train_chunk[", "profile_window[")):
            chunks.setdefault(r.name, []).append(r)
    return chunks


def completed(flow_run: FlowRun) -> FlowRun:
    assert flow_run.code == 0 and flow_run.flow_run.state.is_completed(), flow_run.flow_run.state
    return flow_run


# The three tests below read the session's one flow (tests/support/sessions.py): 6 rollouts in chunks of 2,
# raise@1 (chunk 0-2), kill@3 (chunk 2-4) and kill-engine@5 (chunk 5-6), a profile window at 4-5. Each was
# a flow of its own before --inject-fault took a list.
@pytest.mark.slow
@pytest.mark.timeout(FLOW_RUN_TIMEOUT_S)
def test_a_raising_chunk_is_resubmitted_and_resumes_from_the_interval_checkpoint(flow_run):
    run = completed(flow_run)
    assert journal_steps(run.run_dir) == list(range(SessionFlow.NUM_ROLLOUT))  # nothing lost, nothing doubled
    chunks = attempts_of(run.flow_run)
    attempts = chunks["train_chunk[iter 0..1]"]
    # one retry layer: the flow resubmits the chunk (no Prefect retry inside it), and the API shows both
    assert [r.state.type.value for r in attempts] == ["FAILED", "COMPLETED"] and attempts[0].run_count == 1
    # the chunk without a fault ran once, and so did the finish
    assert [r.state.type.value for r in chunks["profile_window[iter 4]"]] == ["COMPLETED"]
    assert names(task_runs_of(run.flow_run.id))["finish_run"] == 1
    # --save-interval 1 with chunks of 2: a checkpoint after every rollout, not only at chunk ends
    assert sorted(p.name for p in (run.run_dir / "checkpoints").iterdir()) == \
        [f"iter_{i:07d}" for i in range(SessionFlow.NUM_ROLLOUT)]
    assert not ray.is_initialized()


@pytest.mark.slow
@pytest.mark.timeout(FLOW_RUN_TIMEOUT_S)
def test_a_chunk_whose_worker_is_killed_is_resubmitted(flow_run):
    from prefect.artifacts import Artifact

    run = completed(flow_run)
    assert journal_steps(run.run_dir) == list(range(SessionFlow.NUM_ROLLOUT))
    attempts = attempts_of(run.flow_run)["train_chunk[iter 2..3]"]
    assert [r.state.type.value for r in attempts] == ["CRASHED", "COMPLETED"]
    # the run against its baseline reaches Prefect as the comparison artifact (miles compare's verdicts)
    compared = Artifact.get("grpo-compare").data
    assert "rollout/raw_reward" in compared and f"vs {SessionFlow.BASELINE.name}" in compared, compared


def settings_lines(log: Path) -> list[dict]:
    """The effective-settings line each launch of a service wrote first (a relaunch appends its own)."""
    return [json.loads(line)["settings"] for line in log.read_text().splitlines() if line.startswith('{"service"')]


@pytest.mark.slow
@pytest.mark.timeout(FLOW_RUN_TIMEOUT_S)
def test_a_killed_engine_is_relaunched_and_reregistered_and_every_engine_flag_reaches_the_engines(flow_run):
    run = completed(flow_run)
    run_dir = run.run_dir
    assert journal_steps(run_dir) == list(range(SessionFlow.NUM_ROLLOUT))
    assert [r.state.type.value for r in attempts_of(run.flow_run)["train_chunk[iter 5]"]] == ["FAILED", "COMPLETED"]
    counts = names(task_runs_of(run.flow_run.id))
    # two engines launched and registered at start, engine 0 once more after it was killed
    assert counts["launch_engine"] == 3 and counts["register_engine"] == 3
    given = parse_config([*SessionFlow.ENGINE_FLAGS, *SessionFlow.ROUTER_FLAGS])
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
    assert {s.rollout_id for s in spans if s.lane == "trainer" and s.name == "rollout"} == \
        set(range(SessionFlow.NUM_ROLLOUT))


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
