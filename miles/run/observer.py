"""The words the driver loop speaks (`miles.loop.run_loop`): what it drives, who watches, what comes back.

An observer is any object with these methods (subclass `Observer` to get no-op defaults):

    before_iteration(rollout_id: int) -> None
        Called before each iteration; e.g. open a profiling window, fire a test fault.
    after_iteration(result: IterationResult) -> str | None
        Called after each iteration was recorded. Return a reason (a non-empty string) to stop
        the run cleanly: the loop saves a checkpoint of this iteration, closes the trackers as
        the end of the run and returns with `stop_reason` set; e.g. a health detector.
    end(outcome: LoopOutcome | None) -> None
        Called once when the loop ends, also on an exception (then `outcome` may be None or
        partial); e.g. close a profiling window still open.
    live_red_flag(verdict, diagnosis) -> None
        Called from the health watch's timer thread when a phase is open far past its median (the
        iteration has not ended), with the diagnose bundle written for it; e.g. a Prefect event.

Every observer sees every call, in list order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from miles.health import HealthReport
from miles.rollout.sample import Sample


@dataclass
class IterationResult:
    rollout_id: int
    metrics: dict[str, float]  # every train/ rollout/ passrate/ perf/ (eval/) metric and the step counters
    samples: list[Sample]
    health: HealthReport  # the health watch's verdicts on this rollout


@dataclass
class LoopOutcome:
    """What one loop did (a plain run, or one chunk of the flow's): where it resumed, what it ran,
    what it saved, why it stopped early."""

    resumed_at: int  # the first rollout id not already checkpointed
    base_eval: dict[str, float] = field(default_factory=dict)  # the eval before training (fresh runs)
    rollout_ids: list[int] = field(default_factory=list)  # the iterations run
    last_metrics: dict[str, float] = field(default_factory=dict)
    checkpoint: Path | None = None  # the last checkpoint saved
    stop_reason: str | None = None  # an observer stopped the run
    # the plain driver, --use-fault-tolerance: each engine's weight version at the end (None: down)
    engine_versions: list[str | None] = field(default_factory=list)

    @property
    def last_rollout_id(self) -> int:
        """The last rollout trained here, else the last one checkpointed before (-1: none)."""
        return self.rollout_ids[-1] if self.rollout_ids else self.resumed_at - 1


class Observer:
    """No-op defaults of the observer interface (see the module docstring)."""

    def before_iteration(self, rollout_id: int) -> None:
        pass

    def after_iteration(self, result: IterationResult) -> str | None:
        return None

    def end(self, outcome: LoopOutcome | None) -> None:
        pass

    def live_red_flag(self, verdict, diagnosis) -> None:
        """A red flag raised while an iteration still runs (a phase open far past its median), with the
        diagnose bundle written for it (None when it could not be written)."""


class LoopTrainer(Protocol):
    """What the loop needs of a trainer (`miles.trainer.RLTrainer` is the one there is)."""

    config: object
    eval_sets: list

    def resume(self) -> int: ...
    def evaluate_base(self) -> dict[str, float]: ...
    def run_iteration(self, rollout_id: int) -> IterationResult: ...
    def save_checkpoint(self, rollout_id: int) -> Path: ...
    def close(self, final: bool = True) -> None: ...
