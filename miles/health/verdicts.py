"""Verdicts of a run summed per signal, and the table `miles doctor RUN_DIR` prints (one row per signal)."""
from __future__ import annotations

from dataclasses import dataclass

from miles.health.detectors import DETECTORS
from miles.health.history import RunHistory
from miles.health.signals import RED, WARNING, Verdict
from miles.health.watch import active_signals, replay


@dataclass(frozen=True)
class SignalSummary:
    """One signal over the whole run: worst severity, when it was first flagged, and how often."""

    signal: str
    verdict: str  # "ok" | "warning" | "RED"
    first: Verdict | None
    count: int


def summarize(history: RunHistory, overrides: dict | None = None) -> list[SignalSummary]:
    run = history.run_facts()
    verdicts = replay(history.rollouts, history.health_config(overrides), run)
    out = []
    for signal in active_signals(run):
        mine = [v for v in verdicts if v.signal == signal]
        reds = [v for v in mine if v.severity == RED]
        first = (reds or mine or [None])[0]
        verdict = "RED" if reds else (WARNING if mine else "ok")
        out.append(SignalSummary(signal, verdict, first, len(mine)))
    return out


def format_table(history: RunHistory, rows: list[SignalSummary]) -> str:
    width = max(len(s) for s in DETECTORS)
    lines = [f"health of {history.source}: {len(history.rollouts)} rollouts",
             f"{'signal':<{width}}  {'verdict':<7}  {'first':>5}  {'times':>5}  values"]
    for row in rows:
        first = str(row.first.rollout_id) if row.first else "-"
        values = " ".join(f"{k}={v:.4g}" for k, v in row.first.values.items()) if row.first else ""
        lines.append(f"{row.signal:<{width}}  {row.verdict:<7}  {first:>5}  {row.count:>5}  {values}")
    reds = [r.signal for r in rows if r.verdict == "RED"]
    lines.append(f"red flags: {', '.join(reds)}" if reds else "red flags: none")
    return "\n".join(lines)
