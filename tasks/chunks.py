"""The unit of training work a task runs: a range of rollout ids."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chunk:
    """Rollout ids `first` .. `stop - 1`, run by one training task (`profiled`: the profiling window)."""

    first: int
    stop: int
    profiled: bool = False

    @property
    def size(self) -> int:
        return self.stop - self.first
