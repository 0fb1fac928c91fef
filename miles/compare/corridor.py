"""Judge a run against baseline runs, metric by metric and step by step.

At each step the baselines that recorded a metric give its mean and spread; the corridor is the
mean plus (or minus, by the rule's worse direction) the widest of the relative tolerance, the
absolute tolerance and k standard deviations of the baselines. A value past it is outside; a value
past the rule's absolute bounds is outside with or without baselines; a value the run should have
(a step it reached, or every step for a finished run) that is missing or not finite is an error.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from miles.compare.curves import RunCurves
from miles.compare.rules import Rule, rule_for

WITHIN, OUTSIDE, ERROR, UNJUDGED, NOT_REACHED = "within", "outside", "error", "no baseline", "not reached"


@dataclass(frozen=True)
class Point:
    """One step of one metric: the run's value against the baselines' corridor there."""

    step: int
    value: float | None  # None: the run has no value there
    mean: float | None  # None: no baseline there (only absolute bounds apply)
    std: float
    n: int  # baselines with a finite value at this step
    bound: float | None
    verdict: str
    why: str = ""

    def as_json(self) -> dict:
        finite = lambda v: v if v is None or math.isfinite(v) else str(v)  # noqa: E731 (JSON has no NaN)
        return {"step": self.step, "value": finite(self.value), "mean": self.mean, "std": self.std, "n": self.n,
                "bound": self.bound, "delta": None if self.value is None or self.mean is None or
                not math.isfinite(self.value) else self.value - self.mean, "verdict": self.verdict, "why": self.why}


@dataclass(frozen=True)
class SignalResult:
    key: str
    axis: str
    rule: Rule
    verdict: str  # WITHIN | OUTSIDE | ERROR | UNJUDGED | NOT_REACHED
    points: list[Point] = field(default_factory=list)

    @property
    def first(self) -> Point | None:
        """Where it left the corridor (or the first error)."""
        return next((p for p in self.points if p.verdict == self.verdict and self.verdict in (OUTSIDE, ERROR)), None)

    def as_json(self) -> dict:
        first = self.first
        return {"key": self.key, "axis": self.axis, "verdict": self.verdict, "worse": self.rule.worse,
                "rel": self.rule.rel, "abs": self.rule.abs, "k_sigma": self.rule.k_sigma,
                "min": self.rule.min, "max": self.rule.max,
                "first_step": first.step if first else None, "why": first.why if first else "",
                "steps": len(self.points), "steps_outside": sum(p.verdict == OUTSIDE for p in self.points),
                "points": [p.as_json() for p in self.points]}


def _stats(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return mean, std


def judge_point(rule: Rule, step: int, value: float | None, baseline: list[float]) -> Point:
    mean, std = _stats(baseline) if baseline else (None, 0.0)
    bound = rule.bound(mean, std) if mean is not None else None
    n = len(baseline)
    if value is None:
        return Point(step, None, mean, std, n, bound, ERROR, "missing")
    if not math.isfinite(value):
        return Point(step, value, mean, std, n, bound, ERROR, f"not finite ({value})")
    off = rule.out_of_bounds(value)
    if off:
        return Point(step, value, mean, std, n, bound, OUTSIDE, f"{value:.4g} {off}")
    if bound is not None and rule.outside(value, bound):
        side = "above" if rule.worse == "up" else "below"
        return Point(step, value, mean, std, n, bound, OUTSIDE,
                     f"{value:.4g} {side} the corridor {bound:.4g} (baselines' mean {mean:.4g}, n={n})")
    return Point(step, value, mean, std, n, bound, WITHIN)


def judge_signal(key: str, rule: Rule, run: RunCurves, baselines: list[RunCurves], *,
                 finished: bool) -> SignalResult:
    """`finished`: every step the baselines have is one the run must have (the history gate); else a
    step past the run's last one is not judged yet (a run still going, or a shorter one)."""
    axis = run.axis(key)
    mine = run.curves.get(key, {})
    theirs: dict[int, list[float]] = {}
    for b in baselines:
        for step, value in b.curves.get(key, {}).items():
            if math.isfinite(value):
                theirs.setdefault(step, []).append(value)
    reached = run.reached.get(axis)
    steps = sorted(set(theirs) | set(mine))
    if not finished:
        steps = [s for s in steps if s in mine or (reached is not None and s <= reached)]
    points = [judge_point(rule, s, mine.get(s), theirs.get(s, [])) for s in steps]
    if any(p.verdict == ERROR for p in points):
        verdict = ERROR
    elif any(p.verdict == OUTSIDE for p in points):
        verdict = OUTSIDE
    elif not points and theirs:
        verdict = NOT_REACHED  # the run has not reached the baselines' first step of it yet
    elif theirs or rule.min is not None or rule.max is not None:
        verdict = WITHIN
    else:
        verdict = UNJUDGED  # nothing to judge it against (its values are finite)
    return SignalResult(key, axis, rule, verdict, points)


def judge(run: RunCurves, baselines: list[RunCurves], rules: tuple[Rule, ...], *,
          finished: bool = False) -> list[SignalResult]:
    """Every compared metric of the run or its baselines, in the rules' order, then by key."""
    keys = set(run.curves)
    for b in baselines:
        keys |= set(b.curves)
    judged = [(k, rule_for(k, rules)) for k in keys]
    order = {r.pattern: i for i, r in enumerate(rules)}
    judged = sorted(((k, r) for k, r in judged if r is not None), key=lambda kr: (order[kr[1].pattern], kr[0]))
    return [judge_signal(k, r, run, baselines, finished=finished) for k, r in judged]
