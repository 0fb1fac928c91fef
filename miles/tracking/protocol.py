"""The contract between the training loop and tracking (the loop knows nothing else of it).

`open` opens the tracker, once, right after the checkpoint is read (`open({})` for a fresh run);
every other call needs it. Order per rollout: `log_rollout` (custom logger hook, after
generation, before training), then `record` (stdout row + journal line), which every tracker
shows within seconds. A rollout's line is written once: one redone after a crash keeps its
first line, so a retried or resumed chunk cannot double or change a point a tracker shows.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


class RunTracker(Protocol):
    def open(self, extra: dict[str, Any]) -> None:
        """Open the tracker once the checkpoint is read: let delivery open the tracker runs, reattaching
        those whose ids are in `extra` (the checkpoint's `checkpoint_extra`)."""

    def checkpoint_extra(self) -> dict[str, Any]:
        """What the checkpoint must store for `resume` (e.g. wandb/MLflow run ids)."""

    def log_rollout(self, rollout_id: int, args: Any, samples: list, extra_metrics: dict, rollout_time: float) -> None:
        """Miles' custom rollout logger hook, then default rollout logging unless it returned True.
        `extra_metrics` holds the loop's `rollout/` and `passrate/` metrics for these samples: the
        default logging records them, a custom logger returning True replaces them."""

    def log_eval(self, rollout_id: int, args: Any, data: dict, extra_metrics: dict) -> None:
        """Miles' custom eval logger hook, likewise: `extra_metrics` are the loop's `eval/` metrics
        of `data` ({name: {"rewards", "truncated", "samples"}})."""

    def log_base_eval(self, args: Any, data: dict, extra_metrics: dict) -> None:
        """The eval of the starting weights, before rollout 0: the eval logger hook (as rollout 0), then,
        unless it returned True, its own journal line at `eval/step` 0 (rollout id -1: before rollout 0)."""

    def recorded(self, rollout_id: int) -> bool:
        """Whether the rollout has its journal line (then a redo keeps its line, samples and token file)."""

    def record(self, rollout_id: int, metrics: dict[str, float]) -> None:
        """One iteration's metrics (with `train/step`, `rollout/step`, `eval/step`): stdout row + journal
        line (a redone rollout's go to `tracking/redone.jsonl`)."""

    def line_for(self, rollout_id: int, metrics: dict[str, float]) -> dict[str, float]:
        """The journal line `record` would write for these metrics now (with what the loggers left)."""

    def close(self, final: bool = True) -> None:
        """Write the run report, deliver the rest of the journal, upload artifacts, finish tracker runs. `final=False`:
        the run continues in another process; deliver and finish the tracker runs only."""


def validate_tracking_config(config: Any) -> None:
    """Fail before any work on what tracking can check up front (custom logger paths and
    signatures); raises ConfigError naming the flag."""
    from miles.tracking.hooks import validate_tracking_config as validate

    validate(config)


def open_tracking(config: Any, run_dir: Path) -> RunTracker:
    """The tracker for a run, as configured (journal and stdout always on)."""
    from miles.tracking.run_tracker import build_run_tracker

    return build_run_tracker(config, Path(run_dir))
