"""Tracking: the stdout row, the run journal, wandb, MLflow, TensorBoard and custom loggers."""
from miles.tracking.protocol import RunTracker, open_tracking, validate_tracking_config

__all__ = ["RunTracker", "open_tracking", "validate_tracking_config"]
