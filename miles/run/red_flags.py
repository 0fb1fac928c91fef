"""--on-red-flag as loop observers: `stop` stops the run at a red flag, `profile` opens a profiler window."""
from __future__ import annotations

from miles.health import RED, RedFlagStop, stop_message
from miles.run.observer import IterationResult, LoopOutcome, Observer


class RedFlagProfiler(Observer):
    """--on-red-flag profile as a loop observer: a red flag that starts opens a profiler window on the
    next --health-profile-rollouts rollouts (the profiler, itself an observer, opens it before the next one)."""

    def __init__(self, config, profiler):
        self.on, self.rollouts = config.health.on_red_flag == "profile", config.health.health_profile_rollouts
        self.profiler = profiler

    def after_iteration(self, result: IterationResult) -> None:
        if self.on and any(v.severity == RED for v in result.health.started):
            start = result.rollout_id + 1
            window = self.profiler.request_window(start, start + self.rollouts)
            print(f"[health] profiling rollouts {window.start}..{window.end - 1} after the red flag", flush=True)


class RedFlagStopper(Observer):
    """--on-red-flag stop as a loop observer: a red flag asks the loop to stop (it checkpoints the rollout
    and closes the trackers as the run's end); the driver then fails the run with `raise_if_stopped`."""

    def __init__(self, config):
        self.stop = config.health.on_red_flag == "stop"
        self.reason: str | None = None

    def after_iteration(self, result: IterationResult) -> str | None:
        if self.stop and result.health.red:
            self.reason = stop_message(result.health.red)
        return self.reason

    def raise_if_stopped(self, outcome: LoopOutcome) -> None:
        """RedFlagStop naming the flags and the checkpoint the loop saved, if this observer stopped it."""
        if self.reason is not None:
            raise RedFlagStop(f"{self.reason}. Checkpoint: {outcome.checkpoint}")
