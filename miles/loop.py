"""The driver loop of a run: resume -> eval before training -> iterate -> save at --save-interval -> close.

`python -m miles.train` runs it over every rollout; the Prefect training task runs it over one
chunk of rollouts (`rollouts=range(first, stop)`), always saving at the chunk's end so that the
next chunk, maybe in another process, resumes there.

Observers plug in per iteration without changing the loop. An observer is any object with
these methods (subclass `Observer` to get no-op defaults):

    before_iteration(rollout_id: int) -> None
        Called before each iteration; e.g. open a profiling window, fire a test fault.
    after_iteration(result: IterationResult) -> str | None
        Called after each iteration was recorded. Return a reason (a non-empty string) to stop
        the run cleanly: the loop saves a checkpoint of this iteration, closes the trackers as
        the end of the run and returns with `stop_reason` set; e.g. a health detector.
    end(outcome: LoopOutcome | None) -> None
        Called once when the loop ends, also on an exception (then `outcome` may be None or
        partial); e.g. close a profiling window still open.

Every observer sees every call, in list order. Inside an iteration the phases (`rollout`,
`log_probs`, `actor_train`, `update_weights`, `checkpoint`, `eval`) are named in one place,
`miles.run.phases.timed`, where profiling and the timeline hook in.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # the trainer's module defines observers of its own: no import cycle at run time
    from miles.trainer import IterationResult, RLTrainer


class Observer:
    """No-op defaults of the observer interface (see the module docstring)."""

    def before_iteration(self, rollout_id: int) -> None:
        pass

    def after_iteration(self, result: IterationResult) -> str | None:
        return None

    def end(self, outcome: "LoopOutcome | None") -> None:
        pass


@dataclass
class LoopOutcome:
    """What one loop did: where it resumed, what it ran, what it saved, why it stopped early."""

    resumed_at: int  # the first rollout id not already checkpointed
    base_eval: dict[str, float] = field(default_factory=dict)  # the eval before training (fresh runs)
    rollout_ids: list[int] = field(default_factory=list)  # the iterations run
    last_metrics: dict[str, float] = field(default_factory=dict)
    checkpoint: Path | None = None  # the last checkpoint saved
    stop_reason: str | None = None  # an observer stopped the run


def save_due(rollout_id: int, stop: int, save_interval: int | None) -> bool:
    """At every --save-interval-th rollout and at the end of the loop's range."""
    return rollout_id == stop - 1 or bool(save_interval and (rollout_id + 1) % save_interval == 0)


def run_loop(trainer: RLTrainer, rollouts: range, observers: Sequence[Observer] = ()) -> LoopOutcome:
    """Run `rollouts` (resuming past what is checkpointed), then close the trainer. The trackers are
    closed as the end of the run when the range reaches --num-rollout or an observer stopped it."""
    config = trainer.config
    outcome: LoopOutcome | None = None
    try:
        resumed_at = trainer.resume()
        outcome = LoopOutcome(resumed_at)
        if resumed_at == 0 and rollouts.start == 0 and trainer.eval_sets:
            outcome.base_eval = trainer.evaluate_base()
        for rollout_id in range(max(resumed_at, rollouts.start), rollouts.stop):
            for observer in observers:
                observer.before_iteration(rollout_id)
            result = trainer.run_iteration(rollout_id)
            outcome.rollout_ids.append(rollout_id)
            outcome.last_metrics = result.metrics
            reasons = [reason for reason in [o.after_iteration(result) for o in observers] if reason]
            if reasons or save_due(rollout_id, rollouts.stop, config.train.save_interval):
                outcome.checkpoint = trainer.save_checkpoint(rollout_id)
            if reasons:
                outcome.stop_reason = "; ".join(reasons)
                print(f"[trainer] stopping after rollout {rollout_id}: {outcome.stop_reason}", flush=True)
                break
        return outcome
    finally:
        try:
            for observer in observers:
                observer.end(outcome)
        finally:
            stopped = outcome is not None and outcome.stop_reason is not None
            trainer.close(final=stopped or rollouts.stop >= config.rollout.num_rollout)
