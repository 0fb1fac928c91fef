"""Tracker backends behind one small protocol: wandb, MLflow, TensorBoard."""
from miles.tracking.sinks.base import Delivery, Sink, SinkSpec, build_sink

__all__ = ["Delivery", "Sink", "SinkSpec", "build_sink"]
