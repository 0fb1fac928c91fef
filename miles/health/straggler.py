"""The straggler signal: one training rank slower than the others in one phase, rollout after
rollout.

It reads the trainer's `straggler/<phase>/*` metrics (`miles.run.stragglers`: each rank's own work
per phase, its waits for the other ranks left out). A phase straggles in a rollout when its slowest
rank's own work is above --health-straggler-slowdown times the ranks' median and at least
--health-straggler-lag-s seconds above it (a millisecond phase jitters far past any ratio on a
shared machine); the red flag needs the same rank straggling in the same phase for
--health-straggler-window rollouts in a row, so one slow step (a page fault, a noisy neighbour)
never counts. A run with one rank, or whose ranks record no phase spans, logs none of these keys:
the signal is off there.

The weight push is judged the same way over the receiving engines: its figures are each engine's
own receive+apply seconds (`perf/update_weights_engine_time/{p50,max,slowest}`,
`miles.run.engine_stragglers`), and the straggler is named `engine <index>`.
"""
from __future__ import annotations

from typing import Sequence

from miles.config.health import HealthConfig
from miles.health.signals import RED, Verdict

PREFIX = "straggler/"
COORDINATES = ("node", "dp", "pp", "tp")  # the axes `straggler/<phase>/slowest_<axis>` names
ENGINES = "perf/update_weights_engine_time/"  # the engines' own push seconds (engine_stragglers)
PUSH = "weight push"  # how messages name the engines' phase


def phases(metrics: dict[str, float]) -> list[str]:
    """The phases a rollout's metrics hold straggler figures for."""
    return sorted(k.split("/")[1] for k in metrics
                  if k.startswith(PREFIX) and k.endswith("/slowdown"))


def slowest_rank(metrics: dict[str, float], phase: str) -> str | None:
    """The phase's slowest rank by its coordinates, e.g. `node0/dp1/pp0/tp0` (None: not
    recorded)."""
    keys = [f"{PREFIX}{phase}/slowest_{axis}" for axis in COORDINATES]
    if not all(k in metrics for k in keys):
        return None
    return "/".join(f"{axis}{int(metrics[k])}" for axis, k in zip(COORDINATES, keys))


def straggler_in(metrics: dict[str, float], phase: str, cfg: HealthConfig) -> str | None:
    """The rank straggling in `phase` in one rollout, or None when the phase is even enough."""
    key = f"{PREFIX}{phase}/"
    slowdown, high, mid = (metrics.get(key + s) for s in ("slowdown", "max", "median"))
    if None in (slowdown, high, mid):
        return None
    if slowdown > cfg.health_straggler_slowdown and high - mid >= cfg.health_straggler_lag_s:
        return slowest_rank(metrics, phase)
    return None


def engine_slowdown(metrics: dict[str, float]) -> float | None:
    """The slowest engine's own push time over the engines' median (None: not recorded)."""
    high, mid = metrics.get(ENGINES + "max"), metrics.get(ENGINES + "p50")
    if high is None or mid is None or ENGINES + "slowest" not in metrics:
        return None
    return high / mid if mid > 0 else 1.0


def engine_straggler_in(metrics: dict[str, float], cfg: HealthConfig) -> str | None:
    """`engine <index>` when one engine straggled in this rollout's weight push, by the rank
    signal's bounds."""
    slowdown = engine_slowdown(metrics)
    if slowdown is None or slowdown <= cfg.health_straggler_slowdown:
        return None
    if metrics[ENGINES + "max"] - metrics[ENGINES + "p50"] < cfg.health_straggler_lag_s:
        return None
    return f"engine {int(metrics[ENGINES + 'slowest'])}"


def _engine_held(history: Sequence, cfg: HealthConfig) -> Verdict | None:
    """Red when one engine straggled in the weight push for the last window of rollouts."""
    w = cfg.health_straggler_window
    window = history[-w:]
    now = window[-1].metrics
    engine = engine_straggler_in(now, cfg)
    if len(window) < w or engine is None:
        return None
    if any(engine_straggler_in(r.metrics, cfg) != engine for r in window):
        return None
    slowdown, high, mid = engine_slowdown(now), now[ENGINES + "max"], now[ENGINES + "p50"]
    message = (f"{engine} is the straggler of the {PUSH} for {w} rollouts in a row: its own "
               f"receive+apply {high:.3g}s, {slowdown:.2f}x the engines' median {mid:.3g}s")
    values = {ENGINES + k: now[ENGINES + k] for k in ("max", "p50", "slowest")}
    return Verdict(history[-1].rollout_id, "straggler", RED, message, values)


def check_straggler(history: Sequence, cfg: HealthConfig, run) -> Verdict | None:
    """A rank's red flag (`_rank_held`), else an engine's in the weight push (`_engine_held`)."""
    if not history:
        return None
    return _rank_held(history, cfg) or _engine_held(history, cfg)


def _rank_held(history: Sequence, cfg: HealthConfig) -> Verdict | None:
    """Red when one rank straggled in one phase for the last --health-straggler-window rollouts (the
    phase with the largest slowdown now, when several did)."""
    w = cfg.health_straggler_window
    window = history[-w:]
    now = window[-1].metrics
    held = []
    for phase in phases(now):
        rank = straggler_in(now, phase, cfg)
        held_by_rank = all(straggler_in(r.metrics, phase, cfg) == rank for r in window)
        if len(window) == w and rank and held_by_rank:
            held.append((now[f"{PREFIX}{phase}/slowdown"], phase, rank))
    if not held:
        return None
    slowdown, phase, rank = max(held)
    key = f"{PREFIX}{phase}/"
    high, mid = now[key + "max"], now[key + "median"]
    message = (f"rank {rank} is the straggler in {phase} for {w} rollouts in a row: its own work "
               f"{high:.3g}s, {slowdown:.2f}x the ranks' median {mid:.3g}s")
    values = {key + "slowdown": slowdown, key + "max": high, key + "median": mid}
    values.update({key + f"slowest_{axis}": now[key + f"slowest_{axis}"] for axis in COORDINATES})
    return Verdict(history[-1].rollout_id, "straggler", RED, message, values)


def evidence(rollouts: Sequence) -> str | None:
    """What an "ok" straggler row was judged on: the largest lag of the run (slowest rank's own work
    over the median, seconds), where, and its slowdown; None when no rollout holds straggler
    figures. By lag, not slowdown: a phase of microseconds (FSDP's grad_reduce) can be 2x slower on
    one of two ranks and mean nothing."""
    seen = [(r.metrics[f"{PREFIX}{p}/max"] - r.metrics[f"{PREFIX}{p}/median"],
             r.metrics[f"{PREFIX}{p}/slowdown"], p, r.rollout_id)
            for r in rollouts for p in phases(r.metrics)]
    seen += [(r.metrics[ENGINES + "max"] - r.metrics[ENGINES + "p50"], slowdown, PUSH, r.rollout_id)
             for r in rollouts if (slowdown := engine_slowdown(r.metrics)) is not None]
    if not seen:
        return None
    lag, slowdown, phase, rollout_id = max(seen)
    return (f"largest lag {lag:.3g}s ({phase}, rollout {rollout_id}: {slowdown:.3g}x) over "
            f"{len({p for _, _, p, _ in seen})} phases")
