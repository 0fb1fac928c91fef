"""A run's rollouts split into training chunks (one task each); a profiling window is a chunk of its own."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chunk:
    """Rollout ids `first` .. `stop - 1`, run by one training task (`profiled`: the profiling window)."""

    first: int
    stop: int
    profiled: bool = False

    @property
    def rollouts(self) -> range:
        return range(self.first, self.stop)

    @property
    def iters(self) -> str:
        """The chunk's rollouts as the terminal's rows and scorecard write them (`iter 80..99`, both ends
        included), for its Prefect task run's name: a half-open `[80-100]` read as 21 rollouts (N18)."""
        last = self.stop - 1
        return f"iter {self.first}" if last == self.first else f"iter {self.first}..{last}"


def plan_chunks(num_rollout: int, chunk_size: int, window: tuple[int, int] | None = None) -> list[Chunk]:
    """Chunks of at most `chunk_size` covering 0..num_rollout-1, cut at the window's edges so that
    the profiled rollouts [start, end) form exactly one chunk (never split, whatever its size)."""
    if num_rollout < 1 or chunk_size < 1:
        raise ValueError(f"num_rollout and chunk_size must be >= 1, got {num_rollout} and {chunk_size}")
    if window is not None:
        start, end = max(0, window[0]), min(num_rollout, window[1])
        if start >= end:
            window = None  # the window lies outside the run: nothing to profile
    if window is None:
        return _fill(0, num_rollout, chunk_size)
    return [*_fill(0, start, chunk_size), Chunk(start, end, profiled=True), *_fill(end, num_rollout, chunk_size)]


def _fill(first: int, stop: int, chunk_size: int) -> list[Chunk]:
    return [Chunk(i, min(i + chunk_size, stop)) for i in range(first, stop, chunk_size)]


def plan_for(config) -> list[Chunk]:
    profiling = config.profiling
    window = (profiling.profile_step_start, profiling.profile_step_end) if profiling.use_pytorch_profiler else None
    return plan_chunks(config.rollout.num_rollout, config.orchestration.chunk_size, window)
