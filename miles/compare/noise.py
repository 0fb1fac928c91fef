"""How much a metric moves from seed to seed, estimated from the baselines themselves, overflow-safe.

Two estimates, the wider one wins: the spread of the baselines around a step (needs two of them),
and each baseline's own step-to-step jitter (robust: the median absolute change between successive
steps, scaled to a standard deviation). One baseline has no spread at any step, so without the
jitter its corridor would be the rules' bare tolerance, and a second seed of the same run leaves it
by chance (issue 38: grad_norm 1.043 against a bound of 0.887 at one step, n=1). The jitter needs
`MIN_JITTER_STEPS` points; eval curves (a few points, each the mean of hundreds of samples,
dominated by the learning trend) are not given one.

The spread of n=2 baselines at one step is one draw of |a - b| / sqrt(2), a few times too wide or
narrow by chance (issue 55: a reward halved from rollout 3 read "within" against two seeds, one step
just inside a bound widened by such a draw); it is pooled (root mean square) over the steps within
`SPREAD_WINDOW` of the step, so a late divergence of the seeds still widens late steps only.
(Second differences for the jitter, which a steady trend leaves at zero, caught fewer injected
regressions in benchmarks/compare_rates.py: 130 of 150 against 139, no fewer false alarms.)
"""
from __future__ import annotations

import math
import statistics

MIN_JITTER_STEPS = 6  # fewer points: the median of 4 changes is too rough to widen a corridor by
SPREAD_WINDOW = 2  # the baselines' spread at a step: pooled over the steps at most this far from it
# median |x_t+1 - x_t| of Gaussian noise with std s is 0.6745 * sqrt(2) * s
_MEDIAN_ABS_DIFF_TO_STD = 1 / (0.6744897501960817 * math.sqrt(2))


def mean_std(values: list[float]) -> tuple[float, float]:
    """The mean and the sample standard deviation (n-1; 0 for one value) of finite values, computed on the
    values scaled by the largest magnitude, so that values near the float limit (1e308) do not overflow
    to infinity in the sum; the results may still be infinite when the true spread is past the limit."""
    scale = max(abs(v) for v in values) or 1.0
    scaled = [v / scale for v in values]
    mean = math.fsum(scaled) / len(scaled)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in scaled) / (len(scaled) - 1)) if len(scaled) > 1 else 0.0
    return mean * scale, std * scale  # a product past the float limit is inf: the caller refuses it


def jitter(curve: dict[int, float]) -> float:
    """One curve's step-to-step noise as a standard deviation (0 with fewer than MIN_JITTER_STEPS points)."""
    values = [v for _, v in sorted(curve.items()) if math.isfinite(v)]
    if len(values) < MIN_JITTER_STEPS:
        return 0.0
    diffs = [abs(b / 2 - a / 2) * 2 for a, b in zip(values, values[1:])]  # halves: no overflow at 1e308
    return statistics.median(diffs) * _MEDIAN_ABS_DIFF_TO_STD


def pooled_spread(stds: dict[int, float], step: int) -> float:
    """The baselines' spread at `step`: the root mean square of their spreads (`stds`, step -> std,
    only steps where two or more baselines have a value) at the steps within SPREAD_WINDOW of it."""
    near = [sd for s, sd in stds.items() if abs(s - step) <= SPREAD_WINDOW]
    if not near:
        return 0.0
    if not all(math.isfinite(sd) for sd in near):  # a spread past the float limit: no corridor
        return math.inf
    scale = max(near) or 1.0
    return scale * math.sqrt(math.fsum((sd / scale) ** 2 for sd in near) / len(near))


def pooled_jitter(curves: list[dict[int, float]]) -> float:
    """The baselines' jitters pooled (root mean square) over those that have one."""
    found = [j for j in (jitter(c) for c in curves) if j > 0]
    if not found:
        return 0.0
    scale = max(found)
    return scale * math.sqrt(math.fsum((j / scale) ** 2 for j in found) / len(found))
