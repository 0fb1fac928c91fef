"""The slowest training rank and phase of a run, in words, from the journal's straggler metrics.

Each rollout's `straggler/<phase>/*` (`miles.run.stragglers`) says which rank did the most own work
in each phase (its waits for the others left out) and by how much. A rollout straggles in a phase
when that rank is past the health watch's bounds (--health-straggler-slowdown and -lag-s); the rank
and phase that straggled in the most rollouts are the run's straggler. A run whose ranks are even
gets one line saying so, with its largest slowdown; a run without the metrics (one rank) none.

The same for the weight push over the receiving engines (`slowest_engine_lines`), from each push's
`perf/update_weights_engine_time/*` (each engine's own receive+apply seconds): the engine that
straggled in the most pushes, named by its index in the run's engine list.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from miles.config.health import HealthConfig
from miles.record import layout
from miles.record.journal import JournalLine, read_journal
from miles.health.straggler import ENGINES, engine_slowdown, engine_straggler_in
from miles.run.stragglers import slowest, straggling


def _figures(metrics: dict[str, float], phase: str) -> str:
    key = f"straggler/{phase}/"
    return (f"{metrics[key + 'max']:.3g} s of own work vs the ranks' median "
            f"{metrics[key + 'median']:.3g} s, {metrics[key + 'slowdown']:.2f}x")


def slowest_rank_lines(lines: list[JournalLine], cfg: HealthConfig) -> list[str]:
    """One line naming the run's straggler (rank coordinates, phase, how often, its last
    figures), or one saying the ranks were even; none when the journal has no straggler metrics."""
    rows = [ln for ln in lines if any(k.startswith("straggler/") for k in ln.metrics)]
    if not rows:
        return []
    hits: Counter = Counter()
    last: dict[tuple[str, str], JournalLine] = {}
    for line in rows:
        found = straggling(line.metrics, cfg.health_straggler_slowdown, cfg.health_straggler_lag_s)
        for phase, coords in found.items():
            hits[(phase, coords.name)] += 1
            last[(phase, coords.name)] = line
    if hits:
        (phase, rank), count = hits.most_common(1)[0]
        line = last[(phase, rank)]
        return [f"slowest rank: {rank} in `{phase}`, the straggler in {count} of {len(rows)} "
                f"rollouts (rollout {line.rollout_id}: {_figures(line.metrics, phase)})"]
    # the largest lag (seconds over the median), not slowdown: a phase of microseconds can be 2x
    peak = max(((_lag(ln.metrics, k.split("/")[1]), k.split("/")[1], ln) for ln in rows
                for k in ln.metrics if k.startswith("straggler/") and k.endswith("/slowdown")),
               key=lambda t: t[0])
    _, phase, line = peak
    coords = slowest(line.metrics, phase)
    where = f", {coords.name}" if coords else ""
    return [f"training ranks even: no straggler in {len(rows)} rollouts (largest: "
            f"`{phase}`{where} at rollout {line.rollout_id}, {_figures(line.metrics, phase)})"]


def _lag(metrics: dict[str, float], phase: str) -> float:
    return metrics[f"straggler/{phase}/max"] - metrics[f"straggler/{phase}/median"]


def slowest_engine_lines(lines: list[JournalLine], cfg: HealthConfig) -> list[str]:
    """One line naming the engine the weight pushes waited for most often, or one saying the
    engines were even; none when no push recorded two engines' own times."""
    rows = [ln for ln in lines if engine_slowdown(ln.metrics) is not None]
    if not rows:
        return []
    hits = Counter(who for ln in rows if (who := engine_straggler_in(ln.metrics, cfg)))
    if hits:
        engine, count = hits.most_common(1)[0]
        line = [ln for ln in rows if engine_straggler_in(ln.metrics, cfg) == engine][-1]
        return [f"slowest engine: {engine} in the weight push, the straggler in {count} of "
                f"{len(rows)} pushes (rollout {line.rollout_id}: {_engine_figures(line.metrics)})"]
    line = max(rows, key=lambda ln: ln.metrics[ENGINES + "max"] - ln.metrics[ENGINES + "p50"])
    return [f"engines even: no weight-push straggler in {len(rows)} pushes (largest: engine "
            f"{int(line.metrics[ENGINES + 'slowest'])} at rollout {line.rollout_id}, "
            f"{_engine_figures(line.metrics)})"]


def _engine_figures(metrics: dict[str, float]) -> str:
    return (f"{metrics[ENGINES + 'max']:.3g} s of own receive+apply vs the engines' median "
            f"{metrics[ENGINES + 'p50']:.3g} s, {engine_slowdown(metrics):.2f}x")


def read_slowest_rank(run_dir: Path, cfg: HealthConfig) -> list[str]:
    """`slowest_rank_lines` and `slowest_engine_lines` of RUN_DIR's journal (none when it cannot
    be read)."""
    try:
        lines = read_journal(layout.RunLayout(run_dir).journal)
    except (OSError, ValueError):
        return []
    return slowest_rank_lines(lines, cfg) + slowest_engine_lines(lines, cfg)
