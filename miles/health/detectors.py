"""One detector per "What to watch" signal plus liveness: pure functions of the rollouts so far.

Each takes the history (one `Rollout` per recorded rollout, oldest first, the one to judge
last), the health settings and a few run facts, and returns a `Verdict` or None. Thresholds
are robust statistics over a window of the signal's own history, so a noisy healthy run stays
quiet while a break from its own pattern is caught within the window.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

from miles.config.health import HealthConfig
from miles.health.signals import RED, WARNING, Verdict
from miles.health.router_collapse import check_router_collapse
from miles.health.straggler import check_straggler
from miles.record.journal_check import SHARES

MAD_TO_STD = 1.4826  # the MAD of a normal distribution times this is its standard deviation


@dataclass(frozen=True)
class Rollout:
    rollout_id: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class RunFacts:
    """What the detectors need from the rest of the config."""

    clip_grad: float
    groups_per_rollout: int  # --rollout-batch-size: GRPO groups in a rollout
    use_kl_loss: bool


def _judged(key: str, value: float | None) -> float | None:
    """A value a verdict may rest on: a share outside [0, 1] is none (HA1: an aborted_ratio of 5 was a red
    abort storm, -1 "ok"); `miles.record.journal_check` names it as dropped."""
    if value is not None and key in SHARES and not 0.0 <= value <= 1.0:
        return None
    return value


def recent(history: Sequence[Rollout], key: str, n: int) -> list[float]:
    """The last `n` values of `key` (rollouts that lack it are skipped), oldest first."""
    values = [r.metrics[key] for r in history if _judged(key, r.metrics.get(key)) is not None]
    return values[-n:] if n > 0 else []


def current(history: Sequence[Rollout], key: str) -> float | None:
    return _judged(key, history[-1].metrics.get(key)) if history else None


def _verdict(history, signal, severity, message, **values) -> Verdict:
    return Verdict(history[-1].rollout_id, signal, severity, message, {k: float(v) for k, v in values.items()})


def _not_finite(history, signal: str, key: str) -> Verdict | None:
    x = current(history, key)
    if x is not None and not math.isfinite(x):
        return _verdict(history, signal, RED, f"{key} is not finite", **{key: x})
    return None


def check_loss(history, cfg: HealthConfig, run: RunFacts) -> Verdict | None:
    """Non-finite, or far above its window's median in robust (MAD) units."""
    key = "train/loss"
    if (bad := _not_finite(history, "loss", key)) is not None:
        return bad
    x = current(history, key)
    before = [v for v in recent(history[:-1], key, cfg.health_loss_window) if math.isfinite(v)]
    if x is None or len(before) < min(cfg.health_loss_window, 5):
        return None
    median = statistics.median(before)
    mad = statistics.median(abs(v - median) for v in before)
    scale = max(MAD_TO_STD * mad, 1e-6 * max(abs(median), 1.0))
    z = (x - median) / scale
    if z > cfg.health_loss_spike_mads:
        return _verdict(history, "loss", RED, f"loss spiked {z:.0f} MADs above its median of the last "
                        f"{len(before)} rollouts", **{key: x, "median": median, "mad": mad})
    return None


def check_raw_reward(history, cfg: HealthConfig, run: RunFacts) -> Verdict | None:
    """Saturation: across-sample std collapsed and the mean stuck for the whole window; or nearly
    every reward group with zero std (no GRPO signal left) for the whole window."""
    w = cfg.health_raw_reward_window
    window = history[-w:]
    if len(window) < w:
        return None
    means = [r.metrics.get("rollout/raw_reward") for r in window]
    stds = [r.metrics.get("rollout/raw_reward_std") for r in window]
    if None not in means and None not in stds:
        spread = max(means) - min(means)
        if max(stds) < cfg.health_raw_reward_min_std and spread <= cfg.health_raw_reward_max_range:
            return _verdict(history, "raw_reward", RED, f"raw_reward saturated at {means[-1]:.3g} for {w} rollouts "
                            f"(std below {cfg.health_raw_reward_min_std:g})",
                            **{"rollout/raw_reward": means[-1], "rollout/raw_reward_std": stds[-1],
                               "range": spread})
    shares = [zero_std_share(r, run.groups_per_rollout) for r in window]
    if None not in shares and min(shares) >= cfg.health_raw_reward_zero_std_share:
        return _verdict(history, "raw_reward", RED, f"{shares[-1]:.0%} of reward groups have zero std "
                        f"(at least {cfg.health_raw_reward_zero_std_share:.0%} for {w} rollouts)",
                        **{"zero_std_share": shares[-1], "rollout/raw_reward": means[-1] or 0.0})
    return None


def zero_std_share(rollout: Rollout, groups: int) -> float | None:
    counts = [v for k, v in rollout.metrics.items() if k.startswith("rollout/zero_std/count_")]
    if not counts or groups <= 0:
        return None
    return sum(counts) / groups


def check_kl_loss(history, cfg: HealthConfig, run: RunFacts) -> Verdict | None:
    """Only with --use-kl-loss: non-finite, or a jump to many times its recent median."""
    key = "train/kl_loss"
    if not run.use_kl_loss:
        return None
    if (bad := _not_finite(history, "kl_loss", key)) is not None:
        return bad
    x = current(history, key)
    before = recent(history[:-1], key, cfg.health_kl_loss_window)
    if x is None or len(before) < min(cfg.health_kl_loss_window, 3):
        return None
    median = statistics.median(before)
    if x > cfg.health_kl_loss_floor and x > cfg.health_kl_loss_jump * max(median, 0.0):
        return _verdict(history, "kl_loss", RED, f"kl_loss jumped to {x / max(median, 1e-12):.1f}x its median of "
                        f"the last {len(before)} rollouts", **{key: x, "median": median})
    return None


def check_logprob_diff(history, cfg: HealthConfig, run: RunFacts) -> Verdict | None:
    """At or above an absolute ceiling (red), or climbing steadily over the window (warning); not judged on
    a rollout with stale tokens (async GRPO)."""
    key = "train/train_rollout_logprob_abs_diff"
    signal = "train_rollout_logprob_abs_diff"
    x = current(history, key)
    if x is None:
        return None
    if (current(history, "rollout/staleness/max") or 0.0) > 0:
        # async GRPO trained on tokens of older weights: the difference measures that lag, which
        # train/mismatch_kl reports and --staleness-guard bounds, not a numerical mismatch
        return None
    if not math.isfinite(x) or x >= cfg.health_logprob_diff_ceiling:
        return _verdict(history, signal, RED, f"{x:.3g} is at or above the ceiling "
                        f"{cfg.health_logprob_diff_ceiling:g}", **{key: x})
    w = cfg.health_logprob_diff_window
    values = recent(history, key, w)
    if len(values) < w:
        return None
    quarter = max(w // 4, 1)
    first, last = statistics.fmean(values[:quarter]), statistics.fmean(values[-quarter:])
    rises = sum(b > a for a, b in zip(values, values[1:])) / (len(values) - 1)
    if last >= cfg.health_logprob_diff_floor and last >= cfg.health_logprob_diff_growth * first and rises > 0.5:
        return _verdict(history, signal, WARNING, f"climbing: {first:.3g} -> {last:.3g} over {w} rollouts",
                        **{key: x, "first_quarter": first, "last_quarter": last, "rising_share": rises})
    return None


def check_entropy(history, cfg: HealthConfig, run: RunFacts) -> Verdict | None:
    """Collapsed to near 0, or fell below a small share of its highest value in the window before."""
    key = "train/entropy_loss"
    x = current(history, key)
    if x is None:
        return None
    if x <= cfg.health_entropy_loss_floor:
        return _verdict(history, "entropy_loss", RED, f"entropy {x:.3g} is at or below "
                        f"{cfg.health_entropy_loss_floor:g} (mode collapse)", **{key: x})
    before = recent(history[:-1], key, cfg.health_entropy_loss_window)
    if not before:
        return None
    high = max(before)
    if high > 0 and x < cfg.health_entropy_loss_min_ratio * high:
        return _verdict(history, "entropy_loss", RED, f"entropy fell to {x / high:.0%} of its high of the last "
                        f"{len(before)} rollouts", **{key: x, "high": high})
    return None


def check_grad_norm(history, cfg: HealthConfig, run: RunFacts) -> Verdict | None:
    """Non-finite, or at/above --clip-grad in a large share of the window."""
    key = "train/grad_norm"
    if (bad := _not_finite(history, "grad_norm", key)) is not None:
        return bad
    w = cfg.health_grad_norm_window
    values = recent(history, key, w)
    if current(history, key) is None or len(values) < w or run.clip_grad <= 0:
        return None
    share = sum(v >= run.clip_grad for v in values) / len(values)
    if share >= cfg.health_grad_norm_clip_share:
        return _verdict(history, "grad_norm", RED, f"at or above clip_grad={run.clip_grad:g} in {share:.0%} of the "
                        f"last {w} rollouts", **{key: values[-1], "clip_share": share})
    return None


def generation_time(metrics: dict[str, float]) -> tuple[str, float] | None:
    """The time the rollout took to generate: `perf/rollout_time` of a synchronous rollout, of one
    generated ahead (async) `perf/rollout_generate_time`, since its `perf/rollout_time` is only the
    trainer's wait for it, a fraction of a millisecond when the overlap works (issue 55, N23: 9
    "rebalance" warnings on a healthy --max-weight-staleness 1 run)."""
    for key in ("perf/rollout_generate_time", "perf/rollout_time"):
        if key in metrics:
            return key, metrics[key]
    return None


def check_time_balance(history, cfg: HealthConfig, run: RunFacts) -> Verdict | None:
    """The rollout's generation and train_time differing by a large factor for the whole window
    (warning)."""
    w = cfg.health_time_window
    timed = [(generation_time(r.metrics), r.metrics["perf/train_time"]) for r in history[-w:]
             if "perf/train_time" in r.metrics]
    pairs = [(gen[1], train) for gen, train in timed if gen is not None]
    if len(pairs) < w or generation_time(history[-1].metrics) is None:
        return None
    ratios = [max(a, b) / max(min(a, b), 1e-9) for a, b in pairs]
    if min(ratios) >= cfg.health_time_ratio:
        rollout, train = pairs[-1]
        key = generation_time(history[-1].metrics)[0]
        slower = key.removeprefix("perf/") if rollout > train else "train_time"
        return _verdict(history, "rollout_train_time", WARNING, f"{slower} at least {min(ratios):.0f}x the other "
                        f"for {w} rollouts", **{key: rollout, "perf/train_time": train})
    return None


def check_pg_clipfrac(history, cfg: HealthConfig, run: RunFacts) -> Verdict | None:
    key = "train/pg_clipfrac"
    x = current(history, key)
    if x is None:
        return None
    if x > cfg.health_pg_clipfrac_red:
        return _verdict(history, "pg_clipfrac", RED, f"{x:.2f} of tokens clipped (above "
                        f"{cfg.health_pg_clipfrac_red:g})", **{key: x})
    if x > cfg.health_pg_clipfrac_warn:
        return _verdict(history, "pg_clipfrac", WARNING, f"{x:.2f} of tokens clipped (healthy below "
                        f"{cfg.health_pg_clipfrac_warn:g})", **{key: x})
    return None


STALL_KEYS = ("perf/step_time", "perf/rollout_time", "perf/train_time", "perf/update_weights_time")


def check_stall(history, cfg: HealthConfig, run: RunFacts) -> Verdict | None:
    """An iteration or one of its phases far slower than its median so far (at least 3 before it)."""
    worst = None
    for key in STALL_KEYS:
        x = current(history, key)
        before = recent(history[:-1], key, 50)
        if x is None or len(before) < 3:
            continue
        median = statistics.median(before)
        if x > cfg.health_stall_factor * median and x - median >= cfg.health_stall_min_s:
            factor = x / max(median, 1e-9)
            if worst is None or factor > worst[0]:
                worst = (factor, key, x, median)
    if worst is None:
        return None
    factor, key, x, median = worst
    return _verdict(history, "stall", RED, f"{key} took {x:.1f}s, {factor:.0f}x its median {median:.1f}s",
                    **{key: x, "median": median})


def check_router_errors(history, cfg: HealthConfig, run: RunFacts) -> Verdict | None:
    """A burst of router errors, retries and no-worker answers in one rollout's requests."""
    m = history[-1].metrics if history else {}
    requests = m.get("rollout/router_requests")
    if not requests:
        return None
    bad = m.get("rollout/router_errors", 0.0) + m.get("rollout/router_retries", 0.0)
    share = bad / requests
    if share >= cfg.health_router_error_share:
        return _verdict(history, "router_errors", RED, f"{share:.0%} of {requests:.0f} router requests failed, "
                        f"were retried or found no worker",
                        **{k: m.get(k, 0.0) for k in ("rollout/router_requests", "rollout/router_errors",
                                                       "rollout/router_retries", "rollout/router_no_worker")})
    return None


def check_engine_flapping(history, cfg: HealthConfig, run: RunFacts) -> Verdict | None:
    """Engines relaunched in this rollout: a warning for one, red once the window holds
    --health-engine-flap-restarts of them (an engine that keeps dying is not healed by relaunching it)."""
    key = "rollout/engine_restarts"
    now = current(history, key)
    if not now:
        return None
    restarts = sum(recent(history, key, cfg.health_engine_flap_window))
    if restarts >= cfg.health_engine_flap_restarts:
        return _verdict(history, "engine_flapping", RED, f"{restarts:.0f} engine restarts in the last "
                        f"{cfg.health_engine_flap_window} rollouts", **{key: now, "restarts_in_window": restarts})
    return _verdict(history, "engine_flapping", WARNING, f"{now:.0f} engine restart(s) in this rollout",
                    **{key: now, "restarts_in_window": restarts})


def check_abort_storm(history, cfg: HealthConfig, run: RunFacts) -> Verdict | None:
    """A share of the rollout's samples aborted by the engines: red at --health-abort-storm-share, a
    warning from half of it."""
    if not current(history, "rollout/aborted_ratio"):  # no abort at all is no storm, whatever the bound
        return None
    return _share_verdict(history, "abort_storm", "rollout/aborted_ratio", cfg.health_abort_storm_share,
                          "of samples aborted by the engines")


def check_degenerate_groups(history, cfg: HealthConfig, run: RunFacts) -> Verdict | None:
    """Most reward groups without advantage variance: a warning in one rollout, red once it held for the
    window (a few such rollouts happen by chance in a small healthy run)."""
    key = "rollout/degenerate_group_ratio"
    x = current(history, key)
    if x is None or x < cfg.health_degenerate_groups_share:
        return None
    w = cfg.health_degenerate_groups_window
    streak = recent(history, key, w)
    held = len(streak) == w and min(streak) >= cfg.health_degenerate_groups_share
    return _verdict(history, "degenerate_groups", RED if held else WARNING,
                    f"{x:.0%} of reward groups have zero advantage variance"
                    + (f" (at least {cfg.health_degenerate_groups_share:.0%} for {w} rollouts)" if held else ""),
                    **{key: x})


def check_truncation(history, cfg: HealthConfig, run: RunFacts) -> Verdict | None:
    return _share_verdict(history, "truncated_ratio", "rollout/truncated_ratio", cfg.health_truncated_ratio,
                          "of samples truncated")


def _share_verdict(history, signal: str, key: str, bound: float, what: str) -> Verdict | None:
    """A share of the rollout's samples: red at `bound`, a warning from half of it, nothing below."""
    x = current(history, key)
    if x is None or x < bound / 2:
        return None
    return _verdict(history, signal, RED if x >= bound else WARNING, f"{x:.0%} {what}", **{key: x})


def check_param_norm(history, cfg: HealthConfig, run: RunFacts) -> Verdict | None:
    """Exploding weights: the parameter norm not finite, or grown by a large factor within one iteration."""
    key, growth_key = "train/param_norm", "train/param_norm_growth"
    x, growth, lr = current(history, key), current(history, growth_key), current(history, "train/lr")
    if x is None and growth is None:
        return None
    at_lr = f" at lr {lr:g}" if lr is not None and math.isfinite(lr) else ""
    values = {k: v for k, v in ((key, x), (growth_key, growth), ("train/lr", lr)) if v is not None}
    if x is not None and not math.isfinite(x):
        return _verdict(history, "param_norm", RED, f"weights exploding: the parameter norm is not finite{at_lr}",
                        **values)
    if growth is not None and (not math.isfinite(growth) or growth >= cfg.health_param_norm_growth):
        return _verdict(history, "param_norm", RED, f"weights exploding: the parameter norm grew {growth:.3g}x in one "
                        f"iteration{at_lr} (learning rate too high)", **values)
    return None


def check_non_finite(history, cfg: HealthConfig, run: RunFacts) -> Verdict | None:
    """Any metric of the rollout NaN or infinite (the journal records it as null, under `non_finite`)."""
    m = history[-1].metrics if history else {}
    bad = sorted(k for k, v in m.items() if isinstance(v, float) and not math.isfinite(v))
    if not bad:
        return None
    shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    return _verdict(history, "non_finite", RED, f"{len(bad)} metric(s) not finite: {shown}", count=len(bad))


Detector = Callable[[Sequence[Rollout], HealthConfig, RunFacts], "Verdict | None"]

DETECTORS: dict[str, Detector] = {
    "loss": check_loss,
    "raw_reward": check_raw_reward,
    "kl_loss": check_kl_loss,
    "train_rollout_logprob_abs_diff": check_logprob_diff,
    "entropy_loss": check_entropy,
    "grad_norm": check_grad_norm,
    "rollout_train_time": check_time_balance,
    "pg_clipfrac": check_pg_clipfrac,
    "stall": check_stall,
    "router_errors": check_router_errors,
    "engine_flapping": check_engine_flapping,
    "abort_storm": check_abort_storm,
    "degenerate_groups": check_degenerate_groups,
    "truncated_ratio": check_truncation,
    "param_norm": check_param_norm,
    "straggler": check_straggler,
    "router_collapse": check_router_collapse,
    "non_finite": check_non_finite,
}


def judge(history: Sequence[Rollout], cfg: HealthConfig, run: RunFacts) -> list[Verdict]:
    """Every detector's verdict on the last rollout of `history` (those that flag it)."""
    if not history:
        return []
    return [v for check in DETECTORS.values() if (v := check(history, cfg, run)) is not None]
