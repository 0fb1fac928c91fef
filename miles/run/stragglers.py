"""Which training rank the others waited for, per phase of one iteration (`straggler_metrics`).

Each rank reports its own work per phase (`miles.backends.rank_phases`: the seconds of its compute
spans, its waits for the other ranks left out). In synchronous training every rank's phase lasts as
long as the slowest one's, so only this own-work time tells the ranks apart.

Per phase, in seconds: `straggler/<phase>/min`, `/median`, `/max` over the ranks, `/slowdown`
(max / median: 1.0 when the ranks are even) and the slowest rank's coordinates as four numbers,
`/slowest_node`, `/slowest_dp`, `/slowest_pp`, `/slowest_tp` (every tracker holds numbers; the
rank's lane in the timeline carries the same coordinates as text). With two ranks the median is
their mean, so the slowdown is at most 2.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median

# A rank's phases, in the order they run in an iteration: the log-probs (and the reference model's),
# then per optimizer step each micro-batch's forward and backward, the gradient reduction and the
# optimizer step (its clipping included).
RANK_PHASES = ("log_probs", "ref_log_probs", "forward", "backward", "grad_reduce", "optimizer")
COORDINATES = ("node", "dp", "pp", "tp")


@dataclass(frozen=True)
class RankCoords:
    """Where a training rank sits: its node, data-parallel, pipeline and tensor indices."""

    node: int
    dp: int
    pp: int = 0
    tp: int = 0

    @property
    def name(self) -> str:
        """e.g. `node0/dp1/pp0/tp0`: how views and messages name a rank."""
        return "/".join(f"{axis}{getattr(self, axis)}" for axis in COORDINATES)


def straggler_metrics(own_seconds: list[tuple[RankCoords, dict[str, float]]]) -> dict[str, float]:
    """`own_seconds`: each rank's coordinates and its own work per phase in one iteration. The
    metrics of every phase some rank ran (a rank that did not run it counts as 0 s)."""
    out: dict[str, float] = {}
    phases = [p for p in RANK_PHASES if any(p in seconds for _, seconds in own_seconds)]
    for phase in phases:
        ranked = [(seconds.get(phase, 0.0), coords) for coords, seconds in own_seconds]
        values = [value for value, _ in ranked]
        slowest_value, slowest = max(ranked, key=lambda pair: pair[0])
        mid = median(values)
        key = f"straggler/{phase}/"
        out.update({key + "min": min(values), key + "median": mid, key + "max": slowest_value,
                    key + "slowdown": slowest_value / mid if mid > 0 else 1.0})
        out.update({key + f"slowest_{axis}": float(getattr(slowest, axis)) for axis in COORDINATES})
    return out


def slowest(metrics: dict[str, float], phase: str) -> RankCoords | None:
    """The slowest rank of `phase` as `straggler_metrics` named it (None: the phase did not run)."""
    key = f"straggler/{phase}/slowest_"
    if key + "dp" not in metrics:
        return None
    return RankCoords(*(int(metrics[key + axis]) for axis in COORDINATES))


def straggling(metrics: dict[str, float], slowdown: float = 1.5, lag: float = 0.25
               ) -> dict[str, RankCoords]:
    """The phases of one iteration's metrics whose slowest rank is a straggler, with that rank: its
    slowdown above `slowdown` and its own work more than `lag` seconds above the median (phases of
    milliseconds jitter far past any ratio on a shared machine). With two ranks the slowdown is at
    most 2, so a bound for them stays below it."""
    out = {}
    for key in metrics:
        if not (key.startswith("straggler/") and key.endswith("/slowdown")):
            continue
        phase = key.split("/")[1]
        excess = metrics[f"straggler/{phase}/max"] - metrics[f"straggler/{phase}/median"]
        if metrics[key] > slowdown and excess > lag and (coords := slowest(metrics, phase)):
            out[phase] = coords
    return out
