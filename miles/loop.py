"""The driver loop of a run: resume -> eval before training -> iterate -> save at --save-interval -> close.

`python -m miles.train` runs it over every rollout; the Prefect training task runs it over one
chunk of rollouts (`rollouts=range(first, stop)`), always saving at the chunk's end so that the
next chunk, maybe in another process, resumes there. Both go through `train_rollouts`, which adds
the observers every run has (the loop's vocabulary is `miles.run.observer`).

Inside an iteration the phases (`miles.run.phases.PHASES`) are timed by `miles.run.phases.timed`,
where profiling hooks in; `RLTrainer.phase` also writes each as a span of the run's timeline.
"""
from __future__ import annotations

from typing import Callable, Sequence

from miles.diagnose.stall_reaction import StallReaction
from miles.run.engine_loss import EnginesLost
from miles.run.faults import FaultInjector
from miles.run.observer import LoopOutcome, LoopTrainer, Observer
from miles.run.red_flags import RedFlagProfiler, RedFlagStopper


def save_due(rollout_id: int, stop: int, save_interval: int | None) -> bool:
    """At every --save-interval-th rollout and at the end of the loop's range."""
    return rollout_id == stop - 1 or bool(save_interval and (rollout_id + 1) % save_interval == 0)


def run_loop(trainer: LoopTrainer, rollouts: range, observers: Sequence[Observer] = ()) -> LoopOutcome:
    """Run `rollouts` (resuming past what is checkpointed), then close the trainer. The trackers are
    closed as the end of the run when the range reaches --num-rollout or an observer stopped it."""
    config = trainer.config
    outcome: LoopOutcome | None = None
    try:
        resumed_at = trainer.resume()
        outcome = LoopOutcome(resumed_at)
        if resumed_at == 0 and rollouts.start == 0 and trainer.eval_sets:
            outcome.base_eval = trainer.evaluate_base()
        saved = resumed_at - 1  # the last rollout a checkpoint holds
        for rollout_id in range(max(resumed_at, rollouts.start), rollouts.stop):
            for observer in observers:
                observer.before_iteration(rollout_id)
            try:
                result = trainer.run_iteration(rollout_id)
            except EnginesLost as lost:  # no engine will serve again: keep what the ranks trained, then stop
                if lost.trained_through is not None and lost.trained_through > saved:
                    outcome.checkpoint = trainer.save_checkpoint(lost.trained_through)
                    print(f"[trainer] engines lost: saved {outcome.checkpoint} (trained through rollout "
                          f"{lost.trained_through})", flush=True)
                raise
            outcome.rollout_ids.append(rollout_id)
            outcome.last_metrics = result.metrics
            reasons = [reason for reason in [o.after_iteration(result) for o in observers] if reason]
            if reasons or save_due(rollout_id, rollouts.stop, config.train.save_interval):
                outcome.checkpoint, saved = trainer.save_checkpoint(rollout_id), rollout_id
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


def standard_observers(trainer, kill_engine: Callable[[], object] | None = None,
                       fault_targets=None) -> list[Observer]:
    """The observers of every run, in order: the --inject-fault hook (`kill_engine` kills engine 0;
    `fault_targets`, a plain run's services, can kill or stop any engine mid-rollout), the --on-red-flag
    stop and profile reactions, and the trainer's profiler (it opens and closes windows)."""
    config = trainer.config
    requests = config.rollout.rollout_batch_size * config.rollout.n_samples_per_prompt
    return [FaultInjector(config.orchestration.inject_fault, config.train.run_dir, kill_engine=kill_engine,
                          targets=fault_targets, rollout_requests=requests),
            RedFlagStopper(config), RedFlagProfiler(config, trainer.profiler), trainer.profiler]


def train_rollouts(trainer, rollouts: range, observers: Sequence[Observer] = (),
                   kill_engine: Callable[[], object] | None = None, fault_targets=None) -> LoopOutcome:
    """`run_loop` with the standard observers, the live stall reaction, then `observers`. Raises `RedFlagStop`
    (after the loop saved and closed) when --on-red-flag stop ended the run, so that both drivers fail it the
    same way; a run stopped while hung has no checkpoint of the hung rollout."""
    standard = standard_observers(trainer, kill_engine, fault_targets)
    stall = StallReaction(trainer.config, listeners=observers)
    try:
        outcome = run_loop(trainer, rollouts, [*standard, stall, *observers])
    except KeyboardInterrupt as error:  # sent by the stall reaction to stop a hung run, or by the user
        stall.raise_if_stopped(error)
        raise
    for observer in standard:
        if isinstance(observer, RedFlagStopper):
            observer.raise_if_stopped(outcome)
    return outcome
