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
from miles.record.timeline import TIMELINE_NAME, Span, open_spans, read_spans

MIN_ENDED = 3  # ended spans of a phase before its median means anything (as check_stall)
MEDIAN_OF_LAST = 50


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


def open_phases(run_dir: Path, now: float) -> list[OpenPhase]:
    """Every phase open now, the longest open first."""
    ended = read_spans(Path(run_dir) / TIMELINE_NAME)
    out = []
    for span in open_spans(run_dir):
        same = [s.end - s.start for s in ended if s.lane == span.lane and s.name == span.name][-MEDIAN_OF_LAST:]
        median = statistics.median(same) if len(same) >= MIN_ENDED else None
        out.append(OpenPhase(span, max(now - span.start, 0.0), median, len(same)))
    return sorted(out, key=lambda p: -p.open_s)


def is_stalled(phase: OpenPhase, cfg: HealthConfig) -> bool:
    if phase.median_s is None:
        return False
    return phase.open_s > cfg.health_stall_factor * phase.median_s and \
        phase.open_s - phase.median_s >= cfg.health_stall_min_s


def check_open_phase(run_dir: Path, now: float, cfg: HealthConfig) -> Verdict | None:
    """A live `stall` red flag for the open phase furthest past its median, or None."""
    stalled = [p for p in open_phases(run_dir, now) if is_stalled(p, cfg)]
    if not stalled:
        return None
    worst = max(stalled, key=lambda p: p.open_s / max(p.median_s, 1e-9))
    factor = worst.open_s / max(worst.median_s, 1e-9)
    rollout = worst.span.rollout_id if worst.span.rollout_id is not None else -1
    return Verdict(rollout, "stall", RED, f"stalled in {worst.span.name} for {worst.open_s:.0f}s, still open, "
                   f"{factor:.0f}x its median {worst.median_s:.3g}s",
                   {"open_s": worst.open_s, "median": worst.median_s, "factor": factor}, live=True)
