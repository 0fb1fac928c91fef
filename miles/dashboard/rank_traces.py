"""The profiler traces behind the rank heat map: a cell's click lists the windows that ran on
that rank (`--use-pytorch-profiler`, `--profile-ranks`), each a download of its Chrome trace.

A window's summary (RUN_DIR/profiler/summaries.jsonl) names its rank and its trace, relative to
the run dir; a training rank's lane on the timeline is `rank<N>`. A trace is served only from
inside the run dir (a hand-edited summary must not reach any other file).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

LANE_PREFIX = "rank"


def with_traces(heat: dict[str, Any], summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """`heat` (the rank heat map) with each rank's `traces`: the index of each profiler window
    that ran on it (its line in the summaries), with its target and rollouts."""
    if not heat.get("available"):
        return heat
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for index, window in enumerate(summaries):
        rank = window.get("rank")
        if isinstance(rank, int) and not isinstance(rank, bool) and window.get("trace"):
            by_rank.setdefault(rank, []).append(
                {"index": index, "target": window.get("target"), "start": window.get("start"),
                 "end": window.get("end")})
    ranks = [{**row, "traces": by_rank.get(_rank_of(row["lane"]), [])} for row in heat["ranks"]]
    return {**heat, "ranks": ranks}


def _rank_of(lane: str) -> int | None:
    digits = lane[len(LANE_PREFIX):]
    return int(digits) if lane.startswith(LANE_PREFIX) and digits.isdigit() else None


def trace_path(run_dir: Path, summaries: list[dict[str, Any]], index: int) -> Path | None:
    """The trace file of window `index`, when it exists inside the run dir; else None."""
    if not 0 <= index < len(summaries) or not isinstance(summaries[index].get("trace"), str):
        return None
    root = Path(run_dir).resolve()
    path = (root / summaries[index]["trace"]).resolve()
    return path if path.is_file() and path.is_relative_to(root) else None
