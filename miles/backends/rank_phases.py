"""A training rank's own phase spans of one iteration, its waits for the other ranks kept apart.

`span(phase)` times the rank's own work in a phase (a `compute` span); `wait(phase)` is a timed
barrier over the rank group: how long this rank waited until every rank had finished that phase
(a `wait` span). In synchronous training a rank's collective lasts as long as the slowest rank
takes to reach it, so a phase timed whole looks as slow on every rank; with the barrier first,
the slow rank's own span is the long one and the others' wait spans are.

Where the barriers go (`miles.backends.ppo.PPORank`): after the log-probs, and before the
gradient reduction. A backend whose forward and backward passes hold collectives themselves
(FSDP gathers parameters per layer and reduce-scatters gradients in the backward pass) also
waits after each micro-batch's forward and backward (`between_passes`): without it the next
pass's first collective would hold the wait, and a peer's slow forward would show as this
rank's slow backward. What still lands inside a pass is the imbalance of that pass's own layers.

On a GPU each span ends with a device synchronize, so it holds the device's work rather than
the time to launch it. The spans leave the rank with its `RankTrainResult` (`RankSpans`) and
the trainer writes them on the rank's timeline lane; `miles.run.stragglers` turns them into the
straggler metrics. `--inject-fault slow-rank:N:PHASE[:SECONDS]@R` sleeps at the end of one
span of that phase on rank N in rollout R (`miles.run.faults.SlowRank`). What the rank is in now
(`current`) is what `miles.backends.rank_activity` announces when it lasts over a second.
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch
import torch.distributed as dist

from miles.run.faults import SlowRank
from miles.run.stragglers import RANK_PHASES, RankCoords

COMPUTE, WAIT = "compute", "wait"


@dataclass
class RankSpans:
    """One rank's spans of one iteration: (phase, kind, unix start, unix end); kind is compute or
    wait."""

    coords: RankCoords
    spans: list[tuple[str, str, float, float]] = field(default_factory=list)

    def seconds(self, kind: str = COMPUTE) -> dict[str, float]:
        """Seconds per phase of one kind (compute: the rank's own work)."""
        out: dict[str, float] = defaultdict(float)
        for phase, span_kind, start, end in self.spans:
            if span_kind == kind:
                out[phase] += end - start
        return dict(out)


class RankPhaseRecorder:
    """Records one rank's spans; `enabled=False` records nothing and never waits (the benchmark's
    side without it). `between_passes`: wait after every forward and backward (see the module)."""

    def __init__(self, coords: RankCoords, slow: SlowRank | None = None, enabled: bool = True):
        self.coords, self.slow, self.enabled = coords, slow, enabled
        self.between_passes = False
        self.rollout_id: int | None = None
        self._spans: list[tuple[str, str, float, float]] = []
        self._slowed = False  # the slow-rank fault sleeps once per iteration
        # what the rank is in now, (phase, kind, what, unix start), for `rank_activity`'s thread
        self.current: tuple[str, str, str, float] | None = None

    def begin(self, rollout_id: int) -> None:
        """A new iteration: what was recorded and not taken is dropped."""
        self.rollout_id, self._spans, self._slowed = rollout_id, [], False

    def take(self) -> RankSpans | None:
        """This iteration's spans (None when disabled), and a clean slate."""
        spans, self._spans = self._spans, []
        return RankSpans(self.coords, spans) if self.enabled else None

    @contextmanager
    def span(self, phase: str) -> Iterator[None]:
        """The block is this rank's own work in `phase`."""
        if not self.enabled:
            yield
            return
        if phase not in RANK_PHASES:
            raise ValueError(f"unknown rank phase {phase!r}; phases are {', '.join(RANK_PHASES)}")
        start = time.time()
        before, self.current = self.current, (phase, COMPUTE, "", start)
        try:
            yield
            _settle_device()
            self._maybe_slow(phase)
        finally:
            self.current = before
            self._spans.append((phase, COMPUTE, start, time.time()))

    @contextmanager
    def waiting(self, phase: str) -> Iterator[None]:
        """The block is this rank's wait for a peer in `phase` (a pipeline stage's receive from
        its neighbour: `miles.backends.megatron.pipeline_spans`)."""
        if not self.enabled:
            yield
            return
        start = time.time()
        before, self.current = self.current, (phase, WAIT, "a receive from a neighbouring "
                                                           "pipeline stage", start)
        try:
            yield
            _settle_device()
        finally:
            self.current = before
            self._spans.append((phase, WAIT, start, time.time()))

    def wait(self, phase: str, group=None, between_passes: bool = False) -> None:
        """Wait (timed) until every rank of `group` (default: all) has finished `phase`; with
        `between_passes`, only where this backend's passes hold collectives."""
        if not self.enabled or (between_passes and not self.between_passes):
            return
        if not dist.is_initialized() or dist.get_world_size(group) < 2:
            return
        start = time.time()
        self.current = (phase, WAIT, f"barrier over the ranks after {phase}", start)
        try:
            dist.barrier(group=group)
            _settle_device()
        finally:
            self.current = None
        self._spans.append((phase, WAIT, start, time.time()))

    def _maybe_slow(self, phase: str) -> None:
        slow = self.slow
        if slow is None or self._slowed:
            return
        if slow.phase != phase or slow.rollout_id != self.rollout_id:
            return
        self._slowed = True
        time.sleep(slow.seconds)  # the test-only fault: this rank finishes the phase late


def _settle_device() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
