"""Tracker backends behind one small protocol (wandb, MLflow, TensorBoard), and a null sink."""
from miles.tracking.sinks.base import Delivery, NullSink, Sink, SinkSpec, build_sink

__all__ = ["Delivery", "NullSink", "Sink", "SinkSpec", "build_sink"]
