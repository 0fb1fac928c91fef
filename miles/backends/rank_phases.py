"""A training rank's own phase spans of one iteration, its waits for the other ranks kept apart.

`span(phase)` times the rank's own work in a phase (a `compute` span). In synchronous training a
rank's collective lasts as long as the slowest rank takes to reach it, so a phase timed whole
looks as slow on every rank. `arrive(phase)` marks where this rank has finished a phase and goes
on into a collective over all ranks: a timestamp, no communication. Once the group has every
rank's spans of the iteration, `settle_waits` turns the marks into waits: the last rank to
arrive sets when the collective could start, each earlier rank's time from its own arrival to
then becomes a `wait` span, and what it recorded in that time is taken off its next spans. So the
slow rank's own span is the long one and the others' wait spans are, as a barrier at each mark
would show, at no cost to the step (barriers cost 1-4% of a CPU step: benchmarks/rank_phases.py).

Where the marks go (`miles.backends.ppo.PPORank`): before the gradient reduction, and, for a
backend whose forward and backward passes hold collectives themselves (FSDP gathers parameters
per layer and reduce-scatters gradients in the backward pass), after the log-probs and after each
micro-batch's forward and backward (`between_passes`): the next pass's first collective then
holds the wait, and without the mark a peer's slow forward would show as this rank's slow
backward. A backend without collectives in its passes (Megatron's data-parallel ranks) runs on
freely until the gradient reduction, so only that mark is set: its passes are its own work. What
still lands inside a pass is the imbalance of that pass's own layers. Ranks on different hosts
compare their marks on rank 0's clock (`clock_offset`, measured once when the group starts).

On a GPU each span ends with a device synchronize, so it holds the device's work rather than
the time to launch it. The spans leave the rank with its `RankTrainResult` (`RankSpans`), the
group settles them (`miles.backends.group.ActorGroup.train`) and the trainer writes them on the
rank's timeline lane; `miles.run.stragglers` turns them into the straggler metrics.
`--inject-fault slow-rank:N:PHASE[:SECONDS]@R` sleeps at the end of one span of that phase on
rank N in rollout R (`miles.run.faults.SlowRank`). What the rank is in now (`current`), and how
many marks it has passed this iteration (`arrivals`), is what `miles.backends.rank_activity`
announces when a phase lasts over a second: a rank that has passed more marks than a peer is
waiting in a collective for that peer.
"""
from __future__ import annotations

import socket
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
ARRIVE = "arrive"  # a mark: this rank finished the phase and goes into a collective (see the module)


@dataclass
class RankSpans:
    """One rank's spans of one iteration: (phase, kind, unix start, unix end); kind is compute or
    wait."""

    coords: RankCoords
    spans: list[tuple[str, str, float, float]] = field(default_factory=list)
    clock_offset: float = 0.0  # seconds this rank's clock runs ahead of rank 0's (other hosts)

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
        self.clock_offset = 0.0  # see `clock_offset`; set once the group has started
        self.arrivals, self.arrived = 0, ""  # marks passed this iteration, the last one's phase
        # what the rank is in now, (phase, kind, what, unix start), for `rank_activity`'s thread
        self.current: tuple[str, str, str, float] | None = None

    def begin(self, rollout_id: int) -> None:
        """A new iteration: what was recorded and not taken is dropped."""
        self.rollout_id, self._spans, self._slowed = rollout_id, [], False
        self.arrivals, self.arrived = 0, ""

    def take(self) -> RankSpans | None:
        """This iteration's spans (None when disabled), and a clean slate."""
        spans, self._spans = self._spans, []
        return RankSpans(self.coords, spans, self.clock_offset) if self.enabled else None

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

    def arrive(self, phase: str, between_passes: bool = False) -> None:
        """This rank has finished `phase` and goes into a collective over all ranks: a mark for
        `settle_waits` (no communication). With `between_passes`, only where this backend's
        passes hold collectives."""
        if not self.enabled or (between_passes and not self.between_passes):
            return
        now = time.time()
        self.arrivals, self.arrived = self.arrivals + 1, phase
        self._spans.append((phase, ARRIVE, now, now))

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


def settle_waits(recorded: list[RankSpans]) -> None:
    """In place, over every rank's spans of one iteration: each rank's marks (`arrive`) become
    its waits for the last rank to arrive, and its spans after a mark start no earlier than that
    (see the module). The k-th marks of all ranks are one collective; ranks that disagree on a
    mark's phase (they did not run the same schedule) are settled up to there."""
    if len(recorded) < 2:
        for spans in recorded:
            spans.spans = [s for s in spans.spans if s[1] != ARRIVE]
        return
    marks = [[s for s in r.spans if s[1] == ARRIVE] for r in recorded]
    count = min(len(m) for m in marks)
    for k in range(count):
        if len({m[k][0] for m in marks}) > 1:
            count = k
            break
    # on rank 0's clock: when each collective could start (no earlier than the one before)
    starts, floor = [], float("-inf")
    for k in range(count):
        floor = max(max(m[k][2] - r.clock_offset, floor) for m, r in zip(marks, recorded))
        starts.append(floor)
    for r in recorded:
        r.spans = _settled(r.spans, starts, r.clock_offset)


def _settled(spans: list[tuple[str, str, float, float]], starts: list[float],
             offset: float) -> list[tuple[str, str, float, float]]:
    out, k, ready = [], 0, float("-inf")  # ready: when this rank's collective let it go on
    for phase, kind, begin, end in spans:
        if kind != ARRIVE:
            begin = min(max(begin, ready), end)
            out.append((phase, kind, begin, end))
            continue
        if k >= len(starts):  # a mark past the settled ones: no wait known
            continue
        arrived = max(begin, ready)  # a mark reached before the last collective let it go on
        ready = starts[k] + offset
        if ready - arrived > 1e-6:  # below a microsecond: the clocks' float arithmetic, no wait
            out.append((phase, WAIT, arrived, ready))
        k += 1
    return out


def clock_offset(force: bool = False) -> float:
    """Collective over the default group. How far this rank's clock runs ahead of rank 0's, in
    seconds: 0 where every rank shares rank 0's host (one clock), unless `force`; else the median
    over 5 rounds of this rank's time minus rank 0's as each leaves a barrier (they leave within
    a network round trip of each other)."""
    hosts: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    if not force and len(set(hosts)) == 1:
        return 0.0
    diffs = []
    for _ in range(5):
        dist.barrier()
        mine = time.time()
        theirs = torch.tensor([mine], dtype=torch.float64)
        dist.broadcast(theirs, src=0)
        diffs.append(mine - float(theirs))
    return sorted(diffs)[len(diffs) // 2]
