"""The open-phase stall check: the phase a process is in now against the median of its ended runs.

`check_stall` judges an iteration once it ended; a hang never ends, so this looks at the phases
begun and not yet ended (`miles.record.timeline.open_spans`) and measures how long each has been
open against the median of the same lane's and name's ended spans, with the same thresholds
(`--health-stall-factor`, `--health-stall-min-s`).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from miles.config.health import HealthConfig
from miles.health.signals import RED, Verdict
from miles.record.timeline import OPEN_NAME, TIMELINE_NAME, Span, open_spans, read_spans

MIN_ENDED = 3  # ended spans of a phase before its median means anything (as check_stall)
MEDIAN_OF_LAST = 50
# A phase start later than now (past the clocks' slack between processes), or open longer than a year, is
# no phase of a live run: a start at 1.0 read as "open for 1796613739 s" (probe DG3). Such starts are skipped.
CLOCK_SLACK_S = 60.0
MAX_OPEN_S = 365 * 86400.0


def plausible(span: Span, now: float) -> bool:
    """Whether an open span's start can be a phase begun by a run that lives now."""
    return now - MAX_OPEN_S <= span.start <= now + CLOCK_SLACK_S


@dataclass(frozen=True)
class OpenPhase:
    """One phase open now: how long, against the median of its last ended spans (None: too few)."""

    span: Span
    open_s: float
    median_s: float | None
    ended: int

    @property
    def words(self) -> str:
        median = f"median {self.median_s:.3g} s over {self.ended}" if self.median_s is not None else \
            f"no median yet ({self.ended} ended)"
        return f"`{self.span.name}` (rollout {self.span.rollout_id}, {self.span.lane}) open for {self.open_s:.0f} s " \
               f"({median})"


def open_phases(run_dir: Path, now: float, cache: "PhaseCache | None" = None) -> list[OpenPhase]:
    """Every phase open now, the longest open first. With `cache`, the files are read again only when
    they grew (a long run's timeline is large; a timer asks every few seconds)."""
    opened = cache.get(run_dir) if cache is not None else None
    if opened is None:
        durations = ended_durations(read_spans(Path(run_dir) / TIMELINE_NAME))
        opened = []
        for span in (s for s in open_spans(run_dir) if plausible(s, now)):
            same = durations.get((span.lane, span.name), [])[-MEDIAN_OF_LAST:]
            opened.append((span, statistics.median(same) if len(same) >= MIN_ENDED else None, len(same)))
        if cache is not None:
            cache.put(run_dir, opened)
    out = [OpenPhase(span, max(now - span.start, 0.0), median, n) for span, median, n in opened]
    return sorted(out, key=lambda p: -p.open_s)


def ended_durations(ended: list[Span]) -> dict[tuple[str, str], list[float]]:
    """The ended spans' durations by (lane, name), in file order: grouped once, so each open span looks its
    phase up (scanning every ended span for each open one was quadratic: 20,000 of each took 46 s, HA3)."""
    out: dict[tuple[str, str], list[float]] = {}
    for s in ended:
        out.setdefault((s.lane, s.name), []).append(s.end - s.start)
    return out


class PhaseCache:
    """The open phases and their medians as of the timeline files' sizes."""

    def __init__(self):
        self.sizes: tuple[int, int] | None = None
        self.opened: list = []

    @staticmethod
    def _sizes(run_dir: Path) -> tuple[int, int]:
        def size(name: str) -> int:
            try:
                return (Path(run_dir) / name).stat().st_size
            except OSError:
                return -1
        return size(TIMELINE_NAME), size(OPEN_NAME)

    def get(self, run_dir: Path) -> list | None:
        return self.opened if self.sizes is not None and self.sizes == self._sizes(run_dir) else None

    def put(self, run_dir: Path, opened: list) -> None:
        self.sizes, self.opened = self._sizes(run_dir), opened


def is_stalled(phase: OpenPhase, cfg: HealthConfig) -> bool:
    if phase.median_s is None:
        return False
    return phase.open_s > cfg.health_stall_factor * phase.median_s and \
        phase.open_s - phase.median_s >= cfg.health_stall_min_s


def check_open_phase(run_dir: Path, now: float, cfg: HealthConfig, cache: PhaseCache | None = None) -> Verdict | None:
    """A live `stall` red flag for the open phase furthest past its median, or None."""
    stalled = [p for p in open_phases(run_dir, now, cache) if is_stalled(p, cfg)]
    if not stalled:
        return None
    worst = max(stalled, key=lambda p: p.open_s / max(p.median_s, 1e-9))
    factor = worst.open_s / max(worst.median_s, 1e-9)
    rollout = worst.span.rollout_id if worst.span.rollout_id is not None else -1
    return Verdict(rollout, "stall", RED, f"stalled in {worst.span.name} for {worst.open_s:.0f}s, still open, "
                   f"{factor:.0f}x its median {worst.median_s:.3g}s",
                   {"open_s": worst.open_s, "median": worst.median_s, "factor": factor}, live=True)
