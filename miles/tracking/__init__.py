"""Tracking: the stdout row, the run journal, wandb, MLflow, TensorBoard and custom loggers."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from miles.tracking.hooks import validate_tracking_config


def open_tracking(config: Any, run_dir: Path):
    """The run's `RunTracker` (journal and stdout always on; the trackers as configured). The trackers'
    locations come from `config` resolved for `run_dir`: a no-op for a run's prepared config, and the
    same defaults for a tracker opened on raw flags (as tools and tests do)."""
    from miles.config.resolve import resolve
    from miles.tracking.run_tracker import RunTracker  # the sinks' specs and the delivery process

    return RunTracker(resolve(config.replace(run_dir=str(run_dir))), Path(run_dir))


__all__ = ["open_tracking", "validate_tracking_config"]
