"""Verdicts of a run summed per signal, and the table `miles doctor RUN_DIR` prints (one row per signal)."""
from __future__ import annotations

from dataclasses import dataclass

import math

from miles.health.detectors import DETECTORS, Rollout, RunFacts
from miles.health.history import RunHistory
from miles.health.signals import RED, SIGNALS, WARNING, Verdict
from miles.health.router_collapse import evidence as router_evidence
from miles.health.straggler import evidence as straggler_evidence
from miles.health.watch import active_signals, replay
from miles.record.journal import JOURNAL_NAME

OFF = "off"  # a signal this run is not judged on: kl_loss without --use-kl-loss, or none of its keys logged
NOT_LOGGED = "not logged"


@dataclass(frozen=True)
class SignalSummary:
    """One signal over the whole run: worst severity, when it was first flagged, and how often."""

    signal: str
    verdict: str  # "ok" | "warning" | "RED" | "off"
    first: Verdict | None
    count: int
    evidence: str = ""  # for a row with no verdict: the figures that were judged (first -> last, range)


def summarize(history: RunHistory, overrides: dict | None = None) -> list[SignalSummary]:
    run = history.run_facts()
    verdicts = replay(history.rollouts, history.health_config(overrides), run)
    out = []
    active = active_signals(run)
    for signal in DETECTORS:
        if signal not in active:
            out.append(SignalSummary(signal, OFF, None, 0, "not judged: the run has no --use-kl-loss"))
            continue
        mine = [v for v in verdicts if v.signal == signal]
        seen = evidence(history.rollouts, signal, run)
        if not mine and seen == NOT_LOGGED:
            # no figures, no verdict: "off" like kl_loss without --use-kl-loss, not an "ok" resting on nothing
            keys = ", ".join(SIGNALS[signal].keys)
            out.append(SignalSummary(signal, OFF, None, 0, f"not judged: the journal has no {keys}"))
            continue
        reds = [v for v in mine if v.severity == RED]
        first = (reds or mine or [None])[0]
        verdict = "RED" if reds else (WARNING if mine else "ok")
        out.append(SignalSummary(signal, verdict, first, len(mine), seen))
    return out


def evidence(rollouts: list[Rollout], signal: str, run: RunFacts) -> str:
    """What an "ok" row was judged on: each of the signal's journal keys as `name first->last [min, max]`
    over the run (grad_norm also counts the rollouts at or above --clip-grad), or "not logged"."""
    if signal == "straggler":  # its keys are per phase (straggler/<phase>/slowdown)
        return straggler_evidence(rollouts) or NOT_LOGGED
    if signal == "router_collapse":  # its keys are per MoE layer (moe/*_layer_<l>)
        return router_evidence(rollouts) or NOT_LOGGED
    if signal == "non_finite":
        bad = sum(1 for r in rollouts if any(not math.isfinite(v) for v in r.metrics.values()))
        return f"non-finite values in {bad} of {len(rollouts)} rollouts"
    parts = []
    for key in SIGNALS[signal].keys:
        values = [r.metrics[key] for r in rollouts if key in r.metrics]
        if not values:
            continue
        finite = [v for v in values if math.isfinite(v)]
        part = f"{key.split('/', 1)[-1]} {values[0]:.3g}->{values[-1]:.3g}"
        if finite:
            part += f" [{min(finite):.3g}, {max(finite):.3g}]"
        if key == "train/grad_norm" and run.clip_grad > 0:
            part += f" >=clip_grad in {sum(v >= run.clip_grad for v in values)}/{len(values)}"
        parts.append(part)
    return "; ".join(parts) if parts else NOT_LOGGED


def format_table(history: RunHistory, rows: list[SignalSummary]) -> str:
    width = max(len(s) for s in DETECTORS)
    lines = [f"health of {history.source}: {len(history.rollouts)} rollouts"]
    if history.problems:  # what every reader skipped: the verdicts below do not see these values
        lines.append(f"note: {JOURNAL_NAME} has values the verdicts do not see:")
        lines += [f"  {p}" for p in history.problems]
    lines += [f"{'signal':<{width}}  {'verdict':<7}  {'first':>5}  {'times':>5}  values"]
    for row in rows:
        first = str(row.first.rollout_id) if row.first else "-"
        values = " ".join(f"{k}={v:.4g}" for k, v in row.first.values.items()) if row.first else row.evidence
        lines.append(f"{row.signal:<{width}}  {row.verdict:<7}  {first:>5}  {row.count:>5}  {values}")
    reds = [r.signal for r in rows if r.verdict == "RED"]
    lines.append(f"red flags: {', '.join(reds)}" if reds else "red flags: none")
    return "\n".join(lines)
