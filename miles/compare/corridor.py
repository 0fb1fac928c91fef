"""Judge a run against baseline runs, metric by metric and step by step.

At each step the baselines that recorded a metric give its mean; the corridor is the mean plus (or minus,
by the rule's worse direction) the widest of the relative tolerance, the absolute tolerance and k times
the baselines' noise (their spread at that step, or their own step-to-step jitter: `miles.compare.noise`).
A step past the corridor is outside; a signal is a regression (OUTSIDE) only where it is outside at
k of 2k-1 judged steps in a stretch (k the rule's `sustain`: 3 of 5 on the rollout and train axes,
1 on the eval axis), or goes past three times the tolerance at one step: one step just outside is
the noise of a second seed, not a regression. A stretch cut short by the run's end is one when all
its steps (two at least) are outside, and a stretch whose median shortfall passes the tolerance of
its average (the noise shrinking over its steps) is one too. A value past the rule's absolute
bounds is outside with or without baselines; a value the run should have (a step it reached, or
every step for a finished run) that is missing or not finite is an error, as is a corridor that is
not finite (baselines near the float limit).

Eval steps need not line up: a run's eval at step 6 is judged against each baseline's eval curve
interpolated between its evals at 5 and 7; a baseline eval step the run never scheduled is not judged.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from miles.compare.curves import EVAL_AXIS, RunCurves
from miles.compare.noise import mean_std, pooled_jitter, pooled_spread
from miles.compare.rules import Rule, rule_for

WITHIN, OUTSIDE, ERROR, UNJUDGED, NOT_REACHED = "within", "outside", "error", "no baseline", "not reached"
# one step past SPIKE tolerances is a regression by itself (at 2, grad_norm's healthy one-step
# spikes of 2.7 tolerances failed 3 of 42 healthy pairs in benchmarks/compare_rates.py; at 3, none)
SPIKE = 3.0
# judged on fresh rollouts only: on a rollout generated ahead (async) the difference measures the
# weights' lag, as the health watch and training.md say (issue 55, N23: async vs sync failed on it)
FRESH_ONLY = frozenset({"train/train_rollout_logprob_abs_diff"})
STALE_WHY = "stale rollout (async): measures the weights' lag, not judged"


def finite_or_none(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


@dataclass(frozen=True)
class Point:
    """One step of one metric: the run's value against the baselines' corridor there."""

    step: int
    value: float | None  # None: the run has no value there
    mean: float | None  # None: no baseline there (only absolute bounds apply)
    std: float  # the baselines' spread at this step
    n: int  # baselines with a finite value at this step
    bound: float | None
    verdict: str  # WITHIN | OUTSIDE | ERROR | UNJUDGED (no baseline here and no absolute bound)
    why: str = ""
    noise: float = 0.0  # the noise the corridor allows for: max(std, the baselines' jitter)
    spike: bool = False  # outside by more than SPIKE times the tolerance (a regression at one step)
    hard: bool = False  # past an absolute bound (a regression at one step)

    def as_json(self) -> dict:
        value = self.value if self.value is None or math.isfinite(self.value) else str(self.value)  # JSON: no NaN
        delta = None if self.value is None or self.mean is None else finite_or_none(self.value - self.mean)
        return {"step": self.step, "value": value, "mean": finite_or_none(self.mean), "std": finite_or_none(self.std),
                "noise": finite_or_none(self.noise), "n": self.n, "bound": finite_or_none(self.bound),
                "delta": delta, "verdict": self.verdict, "why": self.why}


@dataclass(frozen=True)
class SignalResult:
    key: str
    axis: str
    rule: Rule
    verdict: str  # WITHIN | OUTSIDE | ERROR | UNJUDGED | NOT_REACHED
    points: list[Point] = field(default_factory=list)
    start: Point | None = None  # where the regression (or the first error) starts
    note: str = ""  # what the verdict leaves out: steps with no baseline, excursions that were noise

    @property
    def first(self) -> Point | None:
        """Where it left the corridor for good (or the first error)."""
        return self.start if self.verdict in (OUTSIDE, ERROR) else None

    @property
    def timing(self) -> bool:
        return self.rule.is_timing

    def judged(self) -> list[Point]:
        return [p for p in self.points if p.verdict != UNJUDGED]

    def as_json(self) -> dict:
        first = self.first
        return {"key": self.key, "axis": self.axis, "verdict": self.verdict, "timing": self.timing,
                "worse": self.rule.worse, "rel": self.rule.rel, "abs": self.rule.abs, "k_sigma": self.rule.k_sigma,
                "min": self.rule.min, "max": self.rule.max, "sustain": self.rule.steps_needed(self.axis),
                "first_step": first.step if first else None, "why": first.why if first else "", "note": self.note,
                "steps": len(self.points), "steps_judged": len(self.judged()),
                "steps_outside": sum(p.verdict == OUTSIDE for p in self.points),
                "points": [p.as_json() for p in self.points]}


def judge_point(rule: Rule, step: int, value: float | None, baseline: list[float],
                jitter: float = 0.0, spread: float | None = None) -> Point:
    """`spread`: the baselines' spread pooled over the steps near this one
    (noise.pooled_spread; None: their spread at this step alone)."""
    mean, std = mean_std(baseline) if baseline else (None, 0.0)
    noise = max(std if spread is None else spread, jitter)
    tol = rule.tolerance(mean, noise) if mean is not None else None
    bound = (mean + tol if rule.worse == "up" else mean - tol) if tol is not None else None
    n = len(baseline)
    if value is None:
        return Point(step, None, mean, std, n, bound, ERROR, "missing", noise)
    if not math.isfinite(value):
        return Point(step, value, mean, std, n, bound, ERROR, f"not finite ({value})", noise)
    off = rule.out_of_bounds(value)
    if off:
        return Point(step, value, mean, std, n, bound, OUTSIDE, f"{value:.4g} {off}", noise, hard=True)
    if mean is None:
        verdict = WITHIN if rule.min is not None or rule.max is not None else UNJUDGED
        return Point(step, value, None, std, n, None, verdict, "", noise)
    if not all(math.isfinite(x) for x in (mean, noise, bound)):
        return Point(step, value, mean, std, n, bound, ERROR, f"the baselines' corridor is not finite (mean "
                     f"{mean:.4g}, bound {bound:.4g}, n={n}): nothing to judge against", noise)
    if rule.outside(value, bound):
        side = "above" if rule.worse == "up" else "below"
        spike = abs(value - mean) > SPIKE * tol
        return Point(step, value, mean, std, n, bound, OUTSIDE,
                     f"{value:.4g} {side} the corridor {bound:.4g} (baselines' mean {mean:.4g}, n={n})", noise,
                     spike=spike)
    return Point(step, value, mean, std, n, bound, WITHIN, "", noise)


def _at(curve: dict[int, float], step: int) -> float | None:
    """A baseline's eval curve at `step`: its value there, or interpolated between the evals either side
    (None outside its range: no extrapolation)."""
    if step in curve:
        return curve[step]
    below = [s for s in curve if s < step]
    above = [s for s in curve if s > step]
    if not below or not above:
        return None
    lo, hi = max(below), min(above)
    return curve[lo] + (curve[hi] - curve[lo]) * (step - lo) / (hi - lo)


def _regression(rule: Rule, axis: str, points: list[Point]) -> Point | None:
    """The first point of the first regression: a point past an absolute bound or SPIKE tolerances,
    or one that starts a stretch of 2k-1 judged points of which k are outside the corridor (k: the
    rule's steps_needed; 3 of 5 by default, so a reward outside at rollouts 4, 6 and 7 is one, a
    lone step is not), or a stretch the run's end cut short, or one shifted as a whole
    (`_shifted`)."""
    need = rule.steps_needed(axis)
    judged = [p for p in points if p.verdict != UNJUDGED]  # a step with no baseline neither breaks nor counts
    for i, p in enumerate(judged):
        if p.verdict != OUTSIDE:
            continue
        stretch = judged[i:i + 2 * need - 1]
        outside = sum(q.verdict == OUTSIDE for q in stretch)
        # a stretch cut short by the run's end: every one of its steps outside, two at least (issue
        # 55: a reward halved for the last 3 of 6 rollouts, or an entropy collapsing over the last
        # 2, is a regression, though no later step can complete the 3 of 5)
        ends_outside = len(stretch) < 2 * need - 1 and outside == len(stretch) >= min(2, need)
        if p.hard or p.spike or outside >= need or ends_outside or _shifted(rule, stretch):
            return p
    return None


def _shifted(rule: Rule, stretch: list[Point]) -> bool:
    """The stretch as a whole sits past the corridor: the median shortfall of its points beyond
    the tolerance of their average, whose noise part shrinks as sqrt((1 + 1/n) / m) over m points
    against n baselines (the run's noise and that of the baselines' mean). A reward halved for 3
    steps with per-rollout noise 0.07 is 3 sigma at each step, often just inside at one or two;
    over the stretch it is far outside (issue 55). The median, not the mean: one heavy-tailed step
    (a healthy grad_norm spike) moves no median."""
    pts = [q for q in stretch
           if q.verdict in (WITHIN, OUTSIDE) and q.mean is not None and q.value is not None]
    if len(pts) < 2:
        return False
    m, n = len(pts), min(q.n for q in pts)
    sign = 1.0 if rule.worse == "up" else -1.0
    shift = statistics.median(sign * (q.value - q.mean) for q in pts)
    mean = math.fsum(q.mean for q in pts) / m
    noise = math.fsum(q.noise for q in pts) / m * math.sqrt((1 + 1 / max(n, 1)) / m)
    return math.isfinite(shift) and shift > rule.tolerance(mean, noise)


def _ranges(steps: list[int]) -> str:
    return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])


def judge_signal(key: str, rule: Rule, run: RunCurves, baselines: list[RunCurves], *,
                 finished: bool) -> SignalResult:
    """`finished`: every step the baselines have is one the run must have (the history gate); else a
    step past the run's last one is not judged yet (a run still going, or a shorter one)."""
    axis = run.axis(key)
    fresh = key in FRESH_ONLY
    stale = run.stale if fresh else frozenset()
    mine = {s: v for s, v in run.curves.get(key, {}).items() if s not in stale}
    curves = [{s: v for s, v in b.curves.get(key, {}).items()
               if math.isfinite(v) and not (fresh and s in b.stale)} for b in baselines]
    theirs: dict[int, list[float]] = {}
    for curve in curves:
        for step, value in curve.items():
            theirs.setdefault(step, []).append(value)
    reached = run.reached.get(axis)
    if axis == EVAL_AXIS:
        # the run's own eval steps, each against the baselines' curves there; a baseline's eval step the run
        # did not schedule is not comparable (unless the run is finished and stopped before it)
        scheduled = run.eval_steps()
        past_end = lambda s: finished and (reached is None or s > reached)  # noqa: E731
        steps = sorted(set(mine) | {s for s in theirs if s in scheduled or past_end(s)})
        at = {s: [v for v in (_at(c, s) for c in curves) if v is not None] for s in steps}
    else:
        steps = sorted(set(theirs) | set(mine))
        if not finished:
            steps = [s for s in steps if s in mine or (reached is not None and s <= reached)]
        at = {s: theirs.get(s, []) for s in steps}
    jitter = 0.0 if axis == EVAL_AXIS else pooled_jitter(curves)
    stds = {s: mean_std(v)[1] for s, v in at.items() if len(v) > 1}
    points = [judge_point(rule, s, mine.get(s), at[s], jitter, pooled_spread(stds, s))
              if s not in stale else Point(s, run.curves[key].get(s), None, 0.0, 0, None, UNJUDGED,
                                           STALE_WHY)
              for s in sorted(set(steps) | (stale & set(run.curves.get(key, {}))))]
    error = next((p for p in points if p.verdict == ERROR), None)
    start = error or _regression(rule, axis, points)
    notes = _signal_notes(rule, axis, points, stale, start)
    verdict = _signal_verdict(points, error, start, bool(theirs))
    return SignalResult(key, axis, rule, verdict, points, start, "; ".join(notes))


def _signal_notes(rule: Rule, axis: str, points: list[Point], stale: frozenset,
                  start: Point | None) -> list[str]:
    """What the verdict line adds: stale rollouts left out, steps without a baseline, and steps just
    outside that were noise."""
    notes = []
    unjudged = [p.step for p in points if p.verdict == UNJUDGED and p.step not in stale]
    if stale & {p.step for p in points}:
        skipped = sorted(stale & {p.step for p in points})
        notes.append(f"{len(skipped)} stale rollout(s) not judged ({_ranges(skipped)}): async, the "
                     f"difference measures the weights' lag")
    if unjudged and len(unjudged) < len(points):
        notes.append(f"steps {_ranges([p.step for p in points if p.verdict != UNJUDGED])} judged; "
                     f"{len(unjudged)} with no baseline ({_ranges(unjudged)})")
    outside = [p for p in points if p.verdict == OUTSIDE]
    if outside and start is None:
        need = rule.steps_needed(axis)
        notes.append(f"{len(outside)} step(s) just outside (at {', '.join(str(p.step) for p in outside[:5])}), "
                     f"never {need} of {2 * need - 1} steps nor past {SPIKE:g} times the "
                     f"tolerance: noise")
    return notes


def _signal_verdict(points: list[Point], error: Point | None, start: Point | None,
                    has_baselines: bool) -> str:
    if error is not None:
        return ERROR
    if start is not None:
        return OUTSIDE
    if not points and has_baselines:
        return NOT_REACHED  # the run has not reached the baselines' first step of it yet
    if any(p.verdict != UNJUDGED for p in points):
        return WITHIN
    return UNJUDGED  # nothing to judge it against (its values are finite)


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
