"""The training ranks' part of an iteration's record: their phase spans on the timeline's rank lanes
and the straggler metrics of their own work (`miles.run.stragglers`)."""
from __future__ import annotations

from miles.run.stragglers import straggler_metrics


def write_rank_lanes(timeline, rollout_id: int, summary, results) -> None:
    """Each rank's lane: its own phase spans (`kind` compute) and its waits for the other ranks
    (spans named `wait`, `kind` wait, `phase` the one waited after), each with the rank's
    coordinates (`coords`); a rank without them (a fake) keeps its coarse log_probs and
    actor_train spans."""
    for rank, phases in summary.phases.items():
        recorded = results[rank].rank_spans if rank < len(results) else None
        lane = f"rank{rank}"
        for name, begin, end in phases:
            if recorded is None or name == "token_stats":  # the fine spans replace the coarse
                timeline.add(name, begin, end, rollout_id, lane=lane)
        if recorded is None:
            continue
        for phase, kind, begin, end in recorded.spans:
            name = phase if kind == "compute" else "wait"
            extra = {"phase": phase} if kind != "compute" else {}
            timeline.add(name, begin, end, rollout_id, lane=lane, kind=kind,
                         coords=recorded.coords.name, **extra)


def rank_straggler_metrics(results) -> dict[str, float]:
    """`straggler/<phase>/*` of the ranks' own work; {} from ranks that recorded no phase spans."""
    recorded = [r.rank_spans for r in results if getattr(r, "rank_spans", None) is not None]
    return straggler_metrics([(spans.coords, spans.seconds()) for spans in recorded])
