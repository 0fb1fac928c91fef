"""The live health watch: judges each recorded rollout and reports what it finds.

A red flag or warning becomes a WARN line on stdout (when it starts), one JSON line in
`RUN_DIR/health.jsonl` (every rollout it holds), and `health/<signal>` 0/1 metrics that the
caller records in the rollout's journal line, so every tracker gets them. `miles doctor RUN_DIR` replays
the journal through the same `judge`, so live and offline verdicts agree.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from miles.config.health import HealthConfig
from miles.health.detectors import DETECTORS, Rollout, RunFacts, judge
from miles.health.signals import RED, Verdict, metric_name
from miles.record import layout
from miles.record.journal import JournalLine

HEALTH_LOG = layout.HEALTH


def run_facts(config: Any) -> RunFacts:
    return RunFacts(clip_grad=config.train.clip_grad, groups_per_rollout=config.rollout.rollout_batch_size,
                    use_kl_loss=config.train.use_kl_loss)


def active_signals(run: RunFacts) -> list[str]:
    """The signals a run is judged on (kl_loss only exists with --use-kl-loss)."""
    return [s for s in DETECTORS if s != "kl_loss" or run.use_kl_loss]


def rollouts_of(lines: Iterable[JournalLine]) -> list[Rollout]:
    """One merged row per rollout (an eval line joins its iteration's), `health/*` keys left out; a metric
    the journal lists as non-finite is NaN here, as it was when the live watch judged it."""
    merged: dict[int, dict[str, float]] = {}
    for line in lines:
        if line.rollout_id < 0:
            continue  # the eval before training (rollout id -1) is not an iteration
        row = merged.setdefault(line.rollout_id, {})
        row.update({k: v for k, v in line.metrics.items() if not k.startswith("health/")})
        row.update({k: math.nan for k in line.non_finite if not k.startswith("health/")})
    return [Rollout(rid, metrics) for rid, metrics in sorted(merged.items())]


def replay(rollouts: list[Rollout], cfg: HealthConfig, run: RunFacts) -> list[Verdict]:
    """Every verdict the live watch would have given, rollout by rollout."""
    verdicts = []
    for i in range(len(rollouts)):
        verdicts += judge(rollouts[: i + 1], cfg, run)
    return verdicts


def health_metrics(verdicts: list[Verdict], run: RunFacts) -> dict[str, float]:
    """`health/<signal>`: 1.0 on a red flag this rollout, else 0.0, for every active signal."""
    red = {v.signal for v in verdicts if v.severity == RED}
    return {metric_name(s): float(s in red) for s in active_signals(run)}


def read_health_log(run_dir: Path) -> list[Verdict]:
    path = Path(run_dir) / HEALTH_LOG
    if not path.exists():
        return []
    out = []
    for text in path.read_text().splitlines():
        try:
            out.append(Verdict.from_json(json.loads(text)))
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a torn last line from a killed writer
    return out


class RedFlagStop(RuntimeError):
    """--on-red-flag stop: the run was checkpointed and ends on a red flag (the message says which and why)."""


def stop_message(red: list[Verdict]) -> str:
    flags = "; ".join(f"{v.signal} at rollout {v.rollout_id}: {v.message} "
                      f"({', '.join(f'{k}={x:.4g}' for k, x in v.values.items())})" for v in red)
    return f"health red flag, stopped by --on-red-flag stop: {flags}"


@dataclass
class HealthReport:
    """What the watch found on one rollout: every verdict, the ones that just started, the metrics."""

    rollout_id: int
    verdicts: list[Verdict] = field(default_factory=list)
    started: list[Verdict] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def red(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.severity == RED]


class HealthWatch:
    """Judges each rollout as it is recorded; `resume` rebuilds its history from the journal."""

    def __init__(self, config: Any, run_dir: Path):
        self.cfg: HealthConfig = config.health
        self.run = run_facts(config)
        self.path = Path(run_dir) / HEALTH_LOG
        self.history: list[Rollout] = []
        self.flagged: dict[str, str] = {}  # signal -> severity on the previous rollout

    @property
    def enabled(self) -> bool:
        return self.cfg.health_watch == "on"

    def resume(self, lines: list[JournalLine]) -> None:
        """Continue from a checkpoint, given the journal's lines through it: the same history, and the
        verdicts of rollouts that will be redone dropped from the health log."""
        self.history = rollouts_of(lines)
        last = self.history[-1].rollout_id if self.history else -1
        kept = [v for v in read_health_log(self.path.parent) if v.rollout_id <= last]
        if self.path.exists() or kept:
            self.path.write_text("".join(json.dumps(v.as_json()) + "\n" for v in kept))
        self.flagged = {v.signal: v.severity for v in kept if v.rollout_id == last}

    def observe(self, rollout_id: int, line: dict[str, float]) -> HealthReport:
        """Judge `rollout_id` from the journal line about to be recorded: WARN lines for flags that start
        now, every verdict appended to the health log, and the `health/<signal>` metrics to record with it."""
        if not self.enabled:
            return HealthReport(rollout_id)
        row = Rollout(rollout_id, {k: v for k, v in line.items() if not k.startswith("health/")})
        self.history = [r for r in self.history if r.rollout_id < rollout_id] + [row]
        verdicts = judge(self.history, self.cfg, self.run)
        started = [v for v in verdicts if self.flagged.get(v.signal) != v.severity]
        for verdict in started:
            print(verdict.line(), flush=True)
        if verdicts:
            with self.path.open("a") as f:
                f.write("".join(json.dumps(v.as_json()) + "\n" for v in verdicts))
        self.flagged = {v.signal: v.severity for v in verdicts}
        return HealthReport(rollout_id, verdicts, started, health_metrics(verdicts, self.run))
