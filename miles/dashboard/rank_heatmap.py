"""The rank x phase heat map over a run: each training rank's own work per phase, in seconds.

It sums the spans the trainer writes on the rank lanes (`miles.run.rank_lanes`): `kind` compute
spans, named by their phase, with the rank's coordinates (`coords`, e.g. `node0/dp1/pp0/tp0`). Waits
for the other ranks (`kind` wait) are left out: in synchronous training every rank's phase lasts as
long as the slowest one's, so only the own work tells the ranks apart. Each cell also carries its
ratio to the phase's median over the ranks (the page colours by it: phases differ by orders of
magnitude) and the hottest cell is named, the rank the others waited for most.
"""
from __future__ import annotations

from statistics import median
from typing import Any

from miles.record.timeline import lane_order
from miles.run.stragglers import RANK_PHASES


Cell = tuple[str, str]  # (rank lane, phase)
# a cell this close to its phase's median over the run is even (ratio 1): a phase of microseconds
# (FSDP's grad_reduce) can be 2x on one rank and mean nothing
EVEN_S = 0.01


def _own_work(rows: list[dict[str, Any]]) -> tuple[dict[Cell, float], dict[str, str], set]:
    """Seconds per (lane, phase), each lane's coordinates, and the rollouts seen."""
    seconds: dict[Cell, float] = {}
    coords: dict[str, str] = {}
    rollouts = set()
    for row in rows:
        args = row.get("args")
        if not isinstance(args, dict) or args.get("kind") != "compute":
            continue
        if not isinstance(args.get("coords"), str):
            continue  # a coarse span of a rank without phase spans (a fake backend)
        cell = (str(row.get("lane")), str(row.get("name")))
        seconds[cell] = seconds.get(cell, 0.0) + max(float(row["end"]) - float(row["start"]), 0.0)
        lane = cell[0]
        coords[lane] = args["coords"]
        rollouts.add(row.get("rollout_id"))
    return seconds, coords, rollouts


def rank_heatmap(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """`ranks` (lane and coordinates, in lane order), `phases` (in the order a step runs them),
    `seconds[rank][phase]`, `ratio[rank][phase]` (to the phase's median over the lanes that ran
    it; 1.0 when the median is 0 or the cell within EVEN_S of it), `rollouts` counted and the `hottest` cell; `available` false
    without rank spans."""
    seconds, coords, rollouts = _own_work(rows)
    if not seconds:
        return {"available": False, "ranks": [], "phases": [], "seconds": [], "ratio": [],
                "rollouts": 0, "hottest": None}
    lanes = sorted(coords, key=lane_order)
    seen = {phase for _, phase in seconds}
    phases = [p for p in RANK_PHASES if p in seen] + sorted(seen - set(RANK_PHASES))
    table = [[seconds.get((lane, phase), 0.0) for phase in phases] for lane in lanes]
    # each phase's median over the lanes that ran it: an engine lane (its push phases, with
    # coordinates too) is no 0 s in a training phase, nor a rank in the engine's
    medians = [median(table[i][j] for i, lane in enumerate(lanes) if (lane, phase) in seconds)
               for j, phase in enumerate(phases)]
    ratio = [[value / medians[j] if medians[j] > 0 and abs(value - medians[j]) >= EVEN_S else 1.0
              for j, value in enumerate(row)] for row in table]
    i, j = max(((i, j) for i in range(len(lanes)) for j in range(len(phases))),
               key=lambda ij: (ratio[ij[0]][ij[1]], table[ij[0]][ij[1]]))
    hottest = {"lane": lanes[i], "coords": coords[lanes[i]], "phase": phases[j],
               "seconds": table[i][j], "median": medians[j], "ratio": ratio[i][j]}
    return {"available": True, "ranks": [{"lane": lane, "coords": coords[lane]} for lane in lanes],
            "phases": phases, "seconds": table, "ratio": ratio,
            "rollouts": len({r for r in rollouts if r is not None}), "hottest": hottest}
