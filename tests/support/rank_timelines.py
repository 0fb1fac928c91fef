"""A hand-made timeline of three training ranks whose rank1 is slow in backward (issue 54): the
rank lanes' `kind` compute spans with coordinates and the others' waits, as the trainer writes
them (`miles.run.rank_lanes`). Shared by the heat map's API and browser tests."""
from __future__ import annotations

from miles.record.timeline import Span

COORDS = {"rank0": "node0/dp0/pp0/tp0", "rank1": "node0/dp1/pp0/tp0", "rank2": "node0/dp2/pp0/tp0"}
# own work per rollout: rank1's backward is slow (1.5 s against 0.5 s); its peers wait for it
OWN = {"forward": (0.3, 0.3, 0.32), "backward": (0.5, 1.5, 0.5), "optimizer": (0.01, 0.012, 0.011)}


def rank_spans(rollouts: int = 2) -> list[Span]:
    spans, t = [], 1796104100.0  # after the recorded run's own spans, as a later rollout's
    for rollout_id in range(rollouts):
        spans.append(Span("trainer", "train", t, t + 3.0, rollout_id))
        for i, lane in enumerate(COORDS):
            start = t
            for phase, seconds in OWN.items():
                spans.append(Span(lane, phase, start, start + seconds[i], rollout_id,
                                  {"kind": "compute", "coords": COORDS[lane]}))
                start += seconds[i]
            if lane != "rank1":  # the others wait in the gradient reduction for rank1
                spans.append(Span(lane, "wait", start, start + 1.0, rollout_id,
                                  {"kind": "wait", "coords": COORDS[lane], "phase": "backward"}))
        t += 10.0
    return spans
