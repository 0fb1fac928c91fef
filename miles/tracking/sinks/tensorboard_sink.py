"""TensorBoard as a sink: one scalar per metric key on its namespace's step axis, written as one
event per step axis and journal line with the `tensorboard` package's own writer (no torch import,
a fraction of the CPU of one `add_scalar` per value)."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from miles.record.names import step_of
from miles.tracking.sinks.base import Delivery, SinkSpec


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, params: dict[str, Any], log_dir: str):
        self.params, self.log_dir = params, log_dir
        self.writer = None

    def spec(self) -> SinkSpec:
        return SinkSpec("tensorboard", dict(log_dir=self.log_dir))

    def prepare(self) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: F401

    def open(self) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        Path(self.log_dir).mkdir(parents=True, exist_ok=True)
        self.writer = EventFileWriter(self.log_dir)

    def durable_cursor(self, recorded: int) -> int:
        """The event files are the store: their points carry their journal line's time, one time
        per line, so the lines they hold are counted there (TensorBoard would show a point written
        twice twice)."""
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        return len({event.wall_time for path in Path(self.log_dir).glob("events.out.tfevents.*")
                    for event in EventFileLoader(str(path)).Load() if event.HasField("summary")})

    def deliver(self, delivery: Delivery) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        for line in delivery.lines:
            by_step: dict[int, list] = defaultdict(list)
            for key, value in line.metrics.items():
                by_step[step_of(key, line.metrics, line.rollout_id)].append(Summary.Value(tag=key, simple_value=value))
            for step, values in by_step.items():
                self.writer.add_event(Event(wall_time=line.time, step=step, summary=Summary(value=values)))
        # flushed before the cursor moves: a kill after this point loses nothing
        self.writer.flush()

    def upload(self, files: list[Path]) -> None:
        pass  # scalars only; artifacts go to wandb and MLflow

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
