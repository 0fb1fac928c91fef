"""TensorBoard as a sink: one scalar per metric key, on its namespace's step axis."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from miles.tracking.names import step_of
from miles.tracking.sinks.base import Delivery, SinkSpec


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, params: dict[str, Any], log_dir: str):
        self.params, self.log_dir = params, log_dir
        self.writer = None

    def spec(self) -> SinkSpec:
        return SinkSpec("tensorboard", dict(log_dir=self.log_dir))

    def open(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        Path(self.log_dir).mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=self.log_dir)

    def durable_cursor(self, recorded: int) -> int:
        return recorded

    def deliver(self, delivery: Delivery) -> None:
        for line in delivery.lines:
            for key, value in line.metrics.items():
                self.writer.add_scalar(key, value, step_of(key, line.metrics, line.rollout_id), walltime=line.time)
        # flushed before the cursor moves: a kill after this point loses nothing
        self.writer.flush()

    def upload(self, files: list[Path]) -> None:
        pass  # scalars only; artifacts go to wandb and MLflow

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
