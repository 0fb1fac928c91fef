"""Which engine a weight push waited for: each engine's own receive and apply time, read back from
the spans it wrote on its timeline lane during the push (`miles.engines.push_spans`).

With the broadcast path every engine answers the sender bucket by bucket together, so the sender's
clock gives each engine the same time; only the engine's own compute spans (its waits for the
sender and for its running batch left out) tell a slow one apart. Per push, in seconds:
`perf/update_weights_engine_time/{min,p50,max}` over the engines that recorded spans (the
`{min,p50,max}` of Miles' per-bucket weight-update figures) and, with two engines or more,
`/slowest`: the slowest engine's index in the run's engine list (what the straggler signal judges;
one engine has no one to be slower than). An engine that writes no spans (SGLang, or no run
timeline) is left out; with none, there are no such keys.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from miles.record.timeline import Span, read_spans

KEY = "perf/update_weights_engine_time/"
OWN_PHASES = ("receive", "apply")


class SpanTail:
    """The spans appended to a timeline file after this was made (a push's: its file offset)."""

    def __init__(self, path: Path | None):
        self.path = path
        self.offset = _size(path)

    def spans(self) -> list[Span]:
        """Every whole span line written since (a torn last line is left for the next reader)."""
        return [] if self.path is None else read_spans(self.path, self.offset)


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0


def engine_own_seconds(spans: list[Span], engine_urls: list[str]) -> dict[int, float]:
    """Each engine's own receive+apply seconds, by its index (its span's `engine`, else its URL's
    place in `engine_urls`): the time covered by its compute spans, so the buckets of several
    pipeline stages' groups received at once count once."""
    intervals: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for span in spans:
        args = span.args
        if not span.lane.startswith("engine") or span.name not in OWN_PHASES:
            continue
        if args.get("kind") != "compute":
            continue
        index = args.get("engine")
        if index is None and args.get("url") in engine_urls:
            index = engine_urls.index(args["url"])
        if index is not None:
            intervals[int(index)].append((span.start, span.end))
    return {index: _covered(found) for index, found in intervals.items()}


def _covered(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of the intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def engine_time_metrics(own: dict[int, float]) -> dict[str, float]:
    """`perf/update_weights_engine_time/{min,p50,max}` of one push, and `/slowest` with two
    engines or more ({} without spans)."""
    if not own:
        return {}
    slowest = max(own, key=lambda index: (own[index], -index))
    values = list(own.values())
    out = {KEY + "min": min(values), KEY + "p50": float(statistics.median(values)),
           KEY + "max": own[slowest]}
    return out if len(own) < 2 else {**out, KEY + "slowest": float(slowest)}
