"""Phase spans of a run, one JSON line each in `RUN_DIR/timeline.jsonl`, and their Chrome-trace form.

A span is one process's phase: the trainer's `rollout`, `train`, `update_weights`, `eval`,
`checkpoint`, `log_tokens`; a training rank's `log_probs`, `actor_train`, `token_stats`; an
engine's `decode` stretches (batches back to back); the router's `proxy` bursts and admin events
(`miles.router.lane`). Writing one is a single `write` of one
short line to a file opened for appending, so writers in several processes never
interleave their lines and a reader sees whole lines or a torn last one.
"""
from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from miles.record import layout

TIMELINE_NAME = layout.TIMELINE
OPEN_NAME = layout.TIMELINE_OPEN  # phase starts, so a phase still running (a hang) can be seen before it ends


@dataclass(frozen=True)
class Span:
    lane: str  # the process: "trainer", "rank0", "engine 127.0.0.1:30000", "router"
    name: str  # the phase
    start: float  # unix seconds
    end: float
    rollout_id: int | None = None
    args: dict[str, Any] = field(default_factory=dict)  # small extras (batch size, tokens)

    def to_json(self) -> str:
        raw = asdict(self)
        if not raw["args"]:
            del raw["args"]
        raw["start"], raw["end"] = round(self.start, 6), round(self.end, 6)
        return json.dumps(raw, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "Span":
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "Span":
        return cls(lane=str(raw["lane"]), name=str(raw["name"]), start=float(raw["start"]), end=float(raw["end"]),
                   rollout_id=None if raw.get("rollout_id") is None else int(raw["rollout_id"]),
                   args=dict(raw.get("args") or {}))


class TimelineWriter:
    """Appends spans to one timeline file; `TimelineWriter(None)` writes nothing. With `starts`, `span`
    also writes each phase's start to that file when it begins (`open_spans` pairs the two)."""

    def __init__(self, path: Path | None, lane: str = "trainer", starts: Path | None = None):
        self.path, self.lane = path, lane
        self.seconds = 0.0  # time spent writing, for the overhead benchmark
        self._fd = self._starts_fd = None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if starts is not None:
            self._starts_fd = os.open(starts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, span: Span) -> None:
        if self._fd is None:
            return
        t0 = time.perf_counter()
        os.write(self._fd, (span.to_json() + "\n").encode())  # one write: O_APPEND keeps lines whole
        self.seconds += time.perf_counter() - t0

    def add(self, name: str, start: float, end: float, rollout_id: int | None = None, lane: str | None = None,
            **args: Any) -> None:
        self.write(Span(lane or self.lane, name, start, end, rollout_id, args))

    @contextmanager
    def span(self, name: str, rollout_id: int | None = None, **args: Any) -> Iterator[None]:
        """Time the enclosed block as phase `name` of this writer's lane (written also when it raises)."""
        start = time.time()
        if self._starts_fd is not None:
            begun = Span(self.lane, name, start, start, rollout_id).to_json()
            os.write(self._starts_fd, (begun + "\n").encode())
        try:
            yield
        finally:
            self.add(name, start, time.time(), rollout_id, **args)

    def close(self) -> None:
        for fd in (self._fd, self._starts_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._starts_fd = None


def read_spans(path: Path, offset: int = 0) -> list[Span]:
    """Every complete, well-formed span line from byte `offset` on (a line still being written, or
    torn, is left out)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return []
    spans = []
    for line in data[: data.rfind(b"\n") + 1].splitlines():
        try:
            spans.append(Span.from_json(line.decode()))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            continue
    return spans


def open_spans(run_dir: Path) -> list[Span]:
    """Phases begun and not yet ended: starts in RUN_DIR/timeline-open.jsonl with no span of the same lane,
    name, rollout and start in timeline.jsonl (their `end` is their start; the caller knows the time now)."""
    ended = {(s.lane, s.name, s.rollout_id, round(s.start, 6)) for s in read_spans(Path(run_dir) / TIMELINE_NAME)}
    return [s for s in read_spans(Path(run_dir) / OPEN_NAME)
            if (s.lane, s.name, s.rollout_id, round(s.start, 6)) not in ended]


def chrome_trace(spans: list[Span]) -> dict[str, Any]:
    """The spans as a Chrome trace (Trace Event Format): one thread per lane, times in microseconds
    from the first span, for chrome://tracing or https://ui.perfetto.dev."""
    lanes = sorted({s.lane for s in spans}, key=lane_order)
    tid = {lane: i + 1 for i, lane in enumerate(lanes)}
    origin = min((s.start for s in spans), default=0.0)
    events: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0,
                                     "args": {"name": "miles run"}}]
    events += [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid[lane], "args": {"name": lane}}
               for lane in lanes]
    events += [{"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": tid[lane], "args": {"sort_index": tid[lane]}}
               for lane in lanes]
    for s in spans:
        events.append({"name": s.name, "cat": s.name, "ph": "X", "pid": 1, "tid": tid[s.lane],
                       "ts": round((s.start - origin) * 1e6, 1), "dur": round(max(s.end - s.start, 0.0) * 1e6, 1),
                       "args": {"rollout_id": s.rollout_id, **s.args}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def lane_order(lane: str) -> tuple[int, str]:
    """Trainer first, then ranks, engines, router, anything else."""
    for i, prefix in enumerate(("trainer", "rank", "engine", "router")):
        if lane.startswith(prefix):
            return i, lane.zfill(12) if prefix == "rank" else lane
    return 4, lane
