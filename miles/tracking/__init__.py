"""Tracking: the stdout row, the run journal, wandb, MLflow, TensorBoard and custom loggers."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from miles.tracking.hooks import validate_tracking_config


def open_tracking(config: Any, run_dir: Path):
    """The run's `RunTracker` (journal and stdout always on; the trackers as configured). The trackers'
    locations come from the run's prepared config; raw flags (as tools and tests pass) are resolved for
    `run_dir` here, with the same defaults."""
    from miles.config.resolve import is_resolved, resolve
    from miles.tracking.run_tracker import RunTracker  # the sinks' specs and the delivery process

    if not (is_resolved(config) and Path(config.train.run_dir) == Path(run_dir).resolve()):
        config = resolve(config.replace(run_dir=str(run_dir)))
    return RunTracker(config, Path(run_dir))


__all__ = ["open_tracking", "validate_tracking_config"]
