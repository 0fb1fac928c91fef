"""Runs started once per session and read by many tests (train once, check many times). Loaded by
tests/conftest.py as a plugin, so every folder's tests can ask for them; each run starts only when a test
first asks, and keeps nothing running after it (only its files stay).

`flow_run`: one `miles train` (the GRPO flow on the session's Prefect server, Ray, router, two engines)
that fires three faults in three chunks, profiles a window, compares against a baseline and is given two
secrets. It replaces the separate flows of tests/orchestration/test_grpo_flow.py (3),
test_profile_window.py and tests/security/test_prefect_secrets.py (docs/developer/testing.md).

`plain_run`: one `train()` (python -m miles.train's driver, in this process) with every tracker, a checkpoint
per rollout, an observer that stops it after rollout 1 and a phase hook, and no admin token given. It is
read by tests/training/test_loop.py and tests/security/test_run_token.py (two runs before)."""
from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from miles.run.observer import Observer
from tests.support.dashboard import RECORDED
from tests.support.flags import FLOW, SMALL


@dataclass(frozen=True)
class FlowRun:
    """What the session's flow left: the exit code of `miles train`, its run dir and the grpo flow run."""

    code: int
    run_dir: Path
    flow_run: object  # prefect's FlowRun of the `grpo` flow (its state, its id for `task_runs_of`)
    argv: list[str]


class SessionFlow:
    """The flags of the session's flow, and what each check needs to know of them."""

    NUM_ROLLOUT = 6
    # chunks of 2 with a profile window at 4: train_chunk[iter 0..1], train_chunk[iter 2..3],
    # profile_window[iter 4], train_chunk[iter 5]; one fault in each of the three training chunks,
    # each chunk resubmitted once
    FAULTS = "raise@1,kill@3,kill-engine@5"
    PROFILE = (4, 5)
    WANDB_KEY, ROUTER_TOKEN = "probe-wandb-key-5f1c", "probe-router-token-9a7e"
    # non-default values of every engine flag the embedded engine has, and two router flags
    ENGINE_FLAGS = ["--engine-device", "cpu", "--engine-max-batch-size", "32", "--engine-cpu-threads", "2",
                    "--engine-max-queued-requests", "999", "--context-length", "200"]
    ROUTER_FLAGS = ["--router-policy", "round-robin", "--router-max-retries", "3"]
    BASELINE = RECORDED  # a real recorded run, as a baseline

    @classmethod
    def argv(cls, run_dir: Path) -> list[str]:
        start, end = cls.PROFILE
        return [*FLOW, "--num-rollout", str(cls.NUM_ROLLOUT), "--run-dir", str(run_dir),
                "--rollout-num-engines", "2", "--inject-fault", cls.FAULTS,
                "--save-interval", "1", "--keep-checkpoints", "10", "--baseline-run-dirs", str(cls.BASELINE),
                *cls.ENGINE_FLAGS, *cls.ROUTER_FLAGS,
                "--use-pytorch-profiler", "--profile-step-start", str(start), "--profile-step-end", str(end),
                "--profile-target", "train_overall", "train_actor", "--profile-rollout", "--ray-timeline",
                "--use-mlflow", "--wandb-key", cls.WANDB_KEY, "--router-admin-token", cls.ROUTER_TOKEN]


def grpo_flow_run(name: str):
    """The `grpo` flow run of that name (a flow run is named after its run dir)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterName

    async def read():
        async with get_client() as client:
            return await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])),
                                               flow_filter=FlowFilter(name=FlowFilterName(any_=["grpo"])))

    (run,) = asyncio.run(read())
    return run


SECRET_ENV = ("WANDB_API_KEY", "MILES_ROUTER_ADMIN_TOKEN")
# pytest-timeout counts a fixture's set-up in the test that first asks for it: each test reading the flow gets
# the time of the four flows it replaces (600 s each; on the shared 2-core machine under load a flow took
# over 10 minutes)
FLOW_RUN_TIMEOUT_S = 2400


@pytest.fixture(scope="session")
def flow_run(prefect_api, tmp_path_factory) -> FlowRun:
    """`miles train` (flows.train_command.main) once, in this process, with SessionFlow's flags."""
    from flows.train_command import main
    from tests.support import ray_session

    ray_session.down()  # the flow starts its own Ray, with its workers' runtime env
    run_dir = tmp_path_factory.mktemp("session-flow") / "flow-run"
    argv = SessionFlow.argv(run_dir)
    saved = {name: os.environ.get(name) for name in SECRET_ENV}
    for name in SECRET_ENV:
        os.environ[name] = "placeholder"  # main exports the real ones; put back as they were below
    try:
        code = main(list(argv))
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return FlowRun(code, run_dir, grpo_flow_run(run_dir.name), argv)


# ---- the plain run ----------------------------------------------------------------------------------------

class StopAfter(Observer):
    """An observer that records the loop's calls and stops the run cleanly after rollout `last`."""

    REASON = "enough for this test"

    def __init__(self, last: int):
        self.last, self.seen, self.ended = last, [], None

    def before_iteration(self, rollout_id: int) -> None:
        self.seen.append(("before", rollout_id))

    def after_iteration(self, result) -> str | None:
        self.seen.append(("after", result.rollout_id))
        return self.REASON if result.rollout_id == self.last else None

    def end(self, outcome) -> None:
        self.ended = outcome


@dataclass(frozen=True)
class PlainRun:
    """What the session's plain run left: its summary, run dir, the stopping observer and the phases seen."""

    summary: object  # what miles.train's train() returned: the loop's LoopOutcome
    run_dir: Path
    stopper: StopAfter
    phases: list[str]


PLAIN_ROLLOUTS, PLAIN_STOP_AFTER = 4, 1
PLAIN_RUN_TIMEOUT_S = 1200  # set up inside whichever test asks first: the time of the two runs it replaces
RUN_SECRET_ENV = ("MILES_ROUTER_ADMIN_TOKEN", "MILES_ENGINE_ADMIN_TOKEN", "WANDB_API_KEY")


@pytest.fixture(scope="session")
def plain_run(base_model, tmp_path_factory) -> PlainRun:
    """`train()` once with SMALL flags, --num-rollout 4, --save-interval 1, every tracker (W&B offline), no
    token given; stopped cleanly after rollout 1 by an observer, on the shared Ray (tests/support/ray_session.py)."""
    from contextlib import contextmanager

    from miles.config import parse_config
    from miles.prepare import prepare_config
    from miles.run.phases import add_phase_hook, remove_phase_hook
    from miles.train import train
    from tests.support import ray_session

    ray_session.up()
    run_dir = tmp_path_factory.mktemp("session-plain") / "run"
    config = parse_config([*SMALL, "--num-rollout", str(PLAIN_ROLLOUTS), "--save-interval", "1",
                           "--keep-checkpoints", "10", "--run-dir", str(run_dir), "--wandb-mode", "offline",
                           "--use-wandb", "--use-mlflow", "--use-tensorboard"])
    phases: list[str] = []

    @contextmanager
    def hook(name):
        phases.append(name)
        yield

    stopper = StopAfter(PLAIN_STOP_AFTER)
    saved = {name: os.environ.get(name) for name in RUN_SECRET_ENV}
    add_phase_hook(hook)
    try:
        summary = train(prepare_config(config), observers=[stopper])
    finally:
        remove_phase_hook(hook)
        for name, value in saved.items():  # the run exported its own token; later tests must not inherit it
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return PlainRun(summary, run_dir, stopper, phases)
