"""Runs started once per session and read by many tests (train once, check many times). Loaded by
tests/conftest.py as a plugin, so every folder's tests can ask for them; each run starts only when a test
first asks, and keeps nothing running after it (only its files stay).

`plain_run`: one `train()` (python -m miles.train's driver, in this process) with every tracker, a checkpoint
per rollout, an observer that stops it after rollout 1 and a phase hook, and no admin token given. It is
read by tests/training/test_loop.py and tests/security/test_run_token.py (two runs before)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from miles.run.observer import Observer
from tests.support.flags import SMALL


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

    summary: object  # miles.train's RunSummary
    run_dir: Path
    stopper: StopAfter
    phases: list[str]


PLAIN_ROLLOUTS, PLAIN_STOP_AFTER = 4, 1
PLAIN_RUN_TIMEOUT_S = 1200  # set up inside whichever test asks first: the time of the two runs it replaces
RUN_SECRET_ENV = ("MILES_ROUTER_ADMIN_TOKEN", "MILES_ENGINE_ADMIN_TOKEN", "WANDB_API_KEY")


@pytest.fixture(scope="session")
def plain_run(base_model, tmp_path_factory) -> PlainRun:
    """`train()` once with SMALL flags, --num-rollout 4, --save-interval 1, every tracker (W&B offline), no
    token given; stopped cleanly after rollout 1 by an observer. Ray is the run's own (started and shut down
    by `train`)."""
    from contextlib import contextmanager

    from miles.config import parse_config
    from miles.prepare import prepare_config
    from miles.run.phases import add_phase_hook, remove_phase_hook
    from miles.train import train

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
