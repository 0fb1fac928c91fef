"""Reading Chrome traces: one target's slice of a rank's trace, top operators by self time, span totals,
and the window summaries (RUN_DIR/profiler/summaries.jsonl, a printed table)."""
from __future__ import annotations

import gzip
import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from miles.profiling.window import PHASES, SUMMARIES, profiler_dir
from miles.record.files import write_gzip_atomic

TOP_OPS = 10
OP_CATEGORIES = ("cpu_op", "kernel", "gpu_memcpy", "gpu_memset")  # what "operators" means in a summary


@dataclass
class WindowSummary:
    """What one target's window on one rank (or engine) cost, readable without opening the trace."""

    target: str
    rank: int
    start: int
    end: int
    trace: str  # relative to the run dir when inside it
    top_ops: list[dict] = field(default_factory=list)  # [{name, self_cpu_ms, calls}], largest first
    spans: dict[str, float] = field(default_factory=dict)  # phase -> ms
    memory: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def read_trace(path: Path) -> dict:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def write_trace(trace: dict, path: Path) -> None:
    write_gzip_atomic(path, json.dumps(trace))


def slice_trace(trace: dict, intervals: list[tuple[float, float]], drop_names: set[str]) -> dict:
    """The events that lie inside one of `intervals` (trace microseconds), plus the metadata events;
    events named in `drop_names` (other targets' markers) are left out."""
    ordered = sorted(intervals)

    def inside(event: dict) -> bool:
        ts, end = event["ts"], event["ts"] + event.get("dur", 0)
        return any(a <= ts and end <= b for a, b in ordered)

    kept = [e for e in trace.get("traceEvents", [])
            if e.get("ph") == "M" or ("ts" in e and e.get("name") not in drop_names and inside(e))]
    return {**trace, "traceEvents": kept}


def top_operators(events: list[dict], limit: int = TOP_OPS) -> list[dict]:
    """Operators by self time: an op's duration minus the time of the ops nested in it on its thread."""
    by_thread: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in OP_CATEGORIES:
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    self_us: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for ops in by_thread.values():
        ops.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        stack: list[tuple[float, str]] = []  # (end, name) of the enclosing ops
        for e in ops:
            ts, dur = e["ts"], e.get("dur", 0)
            while stack and stack[-1][0] <= ts:
                stack.pop()
            if stack:
                self_us[stack[-1][1]] -= dur
            self_us[e["name"]] += dur
            calls[e["name"]] += 1
            stack.append((ts + dur, e["name"]))
    ranked = sorted(self_us, key=self_us.get, reverse=True)[:limit]
    return [{"name": n, "self_cpu_ms": round(self_us[n] / 1000, 3), "calls": calls[n]} for n in ranked]


def span_totals(events: list[dict]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e.get("name") in PHASES:
            totals[e["name"]] = totals.get(e["name"], 0.0) + e.get("dur", 0) / 1000
    return {name: round(totals[name], 3) for name in PHASES if name in totals}


def relative(path: Path, run_dir: Path) -> str:
    try:
        return str(Path(path).absolute().relative_to(Path(run_dir).absolute()))
    except ValueError:
        return str(Path(path).absolute())


def summarize_trace(path: Path, *, target: str, rank: int, start: int, end: int, run_dir: Path,
                    memory: Path | None = None, trace: dict | None = None) -> WindowSummary:
    events = (trace or read_trace(path)).get("traceEvents", [])
    return WindowSummary(target, rank, start, end, relative(path, run_dir), top_operators(events),
                         span_totals(events), relative(memory, run_dir) if memory else None)


def append_summaries(run_dir: Path, summaries: list[WindowSummary]) -> Path:
    """One JSON line per window summary (the run dashboard follows this file)."""
    path = profiler_dir(run_dir) / SUMMARIES
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for s in summaries:
            f.write(s.to_json() + "\n")
    return path


def read_summaries(run_dir: Path, start: int | None = None, end: int | None = None) -> list[WindowSummary]:
    """The summaries on file, the last line winning for a (target, rank, start, end) written twice
    (a retried window); optionally only windows overlapping rollouts [start, end)."""
    path = profiler_dir(run_dir) / SUMMARIES
    if not path.exists():
        return []
    latest: dict[tuple, WindowSummary] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            s = WindowSummary(**json.loads(line))
            latest[(s.target, s.rank, s.start, s.end)] = s
    return [s for s in latest.values()
            if start is None or end is None or (s.start < end and start < s.end)]


def format_table(summaries: list[WindowSummary], ops: int = 5) -> str:
    """A plain-text report: per window, the span totals and the top operators by self time."""
    lines = []
    for s in summaries:
        spans = " ".join(f"{k}={v:.1f}ms" for k, v in s.spans.items())
        lines.append(f"[profiler] {s.target} rank {s.rank} rollouts {s.start}-{s.end}: {s.trace}"
                     + (f" | {spans}" if spans else ""))
        for op in s.top_ops[:ops]:
            lines.append(f"    {op['self_cpu_ms']:10.2f} ms  {op['calls']:6d} calls  {op['name']}")
    return "\n".join(lines)


def summary_rows(summaries: list[WindowSummary]) -> list[dict]:
    """Table rows (one per window and top operator) for a Prefect table artifact."""
    rows = []
    for s in summaries:
        spans = ", ".join(f"{k} {v:.1f} ms" for k, v in s.spans.items())
        for op in s.top_ops or [{"name": "", "self_cpu_ms": 0.0, "calls": 0}]:
            rows.append({"target": s.target, "rank": s.rank, "rollouts": f"{s.start}-{s.end}",
                         "operator": op["name"], "self_cpu_ms": op["self_cpu_ms"], "calls": op["calls"],
                         "spans": spans, "trace": s.trace})
    return rows
