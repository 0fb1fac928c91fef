"""The training rank's side of a window: one torch profiler per rank and window, one trace per target.

`RankProfiler` lives in every training rank (FSDP and Megatron alike, through `PPORank`). While no
window is open, `section` and `span` return a shared no-op context: nothing profiles, nothing is
slower. torch runs one profiler per process at a time, so a window with several targets records
their sections with one profiler (started at the first section, stopped once at `close`, collection
toggled off between sections) and writes each target's trace as the slice of that recording inside
the target's sections: `train_overall` whole iterations, `train_actor` the optimizer steps,
`train_log_probs` the log-prob passes. Each section is `ProfilerStep#<rollout id>` in its trace.
"""
from __future__ import annotations

import json
import logging
import pickle
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from miles.profiling.summary import WindowSummary, read_trace, slice_trace, summarize_trace, write_trace
from miles.profiling.window import ProfileWindow

log = logging.getLogger(__name__)
_IDLE = nullcontext()
MARK = "miles_section:"  # internal section markers, renamed ProfilerStep#N in the target's own trace


def _marker(target: str, rollout_id: int) -> str:
    return f"{MARK}{target}#{rollout_id}"


class RankProfiler:
    """This rank's open window (if any): the profiler, the open sections and spans."""

    def __init__(self, rank: int):
        self.rank = rank
        self.coords = None  # RankCoords of a model-parallel rank: its traces are named by them
        self.window: ProfileWindow | None = None
        self.prof: profile | None = None
        self.open_sections: dict[str, record_function] = {}  # target -> its running marker
        self.rollouts: dict[str, list[int]] = {}  # target -> rollouts it recorded
        self.spans: dict[str, record_function] = {}
        self.collecting = False
        self.error: str | None = None  # why the last window was dropped, for the trainer to report
        self.activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])

    @property
    def memory(self) -> bool:
        return self.window is not None and self.window.memory_path is not None

    def open(self, window: ProfileWindow) -> bool:
        """Arm the window on this rank; False when this rank does not profile."""
        if self.window is not None:
            self.close()
        if self.rank not in window.ranks:
            return False
        self.window, self.rollouts = window, {t: [] for t in window.targets}
        if self.memory and torch.cuda.is_available():
            torch.cuda.memory._record_memory_history(max_entries=1_000_000)
        return True

    # ---- sections -------------------------------------------------------------------------
    def section(self, target: str, rollout_id: int):
        """A context profiling one rollout's share of `target` (a shared no-op outside a window)."""
        if self.window is None or target not in self.rollouts or rollout_id not in self.window:
            return _IDLE
        return self._section(target, rollout_id)

    @contextmanager
    def _section(self, target: str, rollout_id: int) -> Iterator[None]:
        self.begin(target, rollout_id)
        try:
            yield
        finally:
            self.end(target)

    def begin(self, target: str, rollout_id: int) -> None:
        if self.window is None or target not in self.rollouts or rollout_id not in self.window:
            return
        self.end(target)
        try:
            self._collect(True)
        except Exception as exc:  # a profiler that cannot start must not stop training
            log.exception("rank %d: the profiler did not start; window %s dropped", self.rank, self.window.label)
            self.error = f"rank {self.rank}: profiler start failed: {exc!r}"
            self.window, self.prof = None, None
            return
        marker = record_function(_marker(target, rollout_id))
        marker.__enter__()
        self.open_sections[target] = marker
        self.rollouts[target].append(rollout_id)

    def end(self, target: str) -> None:
        marker = self.open_sections.pop(target, None)
        if marker is not None:
            marker.__exit__(None, None, None)
            if not self.open_sections:
                self._collect(False)

    def _collect(self, on: bool) -> None:
        if self.prof is None:
            memory = self.memory and not torch.cuda.is_available()  # the CPU timeline: allocation events
            self.prof = profile(activities=self.activities, profile_memory=memory)
            self.prof.start()
            self.collecting = True
        if on != self.collecting:
            self.prof.toggle_collection_dynamic(on, self.activities)
            self.collecting = on

    # ---- spans (train_overall's phases) ---------------------------------------------------
    def span(self, name: str):
        """A named phase of `train_overall` (a shared no-op outside a window)."""
        if "train_overall" not in self.open_sections:
            return _IDLE
        return record_function(name)

    def enter_span(self, name: str) -> None:
        if "train_overall" in self.open_sections:
            self.spans[name] = record_function(name)
            self.spans[name].__enter__()

    def exit_span(self, name: str) -> None:
        rec = self.spans.pop(name, None)
        if rec is not None:
            rec.__exit__(None, None, None)

    # ---- close ----------------------------------------------------------------------------
    def close(self, end: int | None = None) -> list[WindowSummary]:
        """Stop the profiler; write each target's trace (and the memory file); return the summaries.
        `end`: the window stopped early (its chunk ended), files are named after the rollouts it ran."""
        window, self.window = self.window, None
        if window is None:
            return []
        if end is not None and window.start < end < window.end:
            window = replace(window, end=end)
        for name in list(self.spans):
            self.exit_span(name)
        for target in list(self.open_sections):
            self.end(target)
        prof, self.prof = self.prof, None
        try:
            if prof is None:
                return []
            self._collect_on(prof)
            prof.stop()
            return self._write(prof, window)
        finally:
            if window.memory_path is not None and torch.cuda.is_available():
                path = window.memory_file(self.rank)
                path.parent.mkdir(parents=True, exist_ok=True)
                torch.cuda.memory._dump_snapshot(str(path))  # the pickle pytorch.org/memory_viz reads
                torch.cuda.memory._record_memory_history(enabled=None)

    def _collect_on(self, prof: profile) -> None:
        if not self.collecting:
            prof.toggle_collection_dynamic(True, self.activities)  # stop() expects collection on
            self.collecting = True

    def _write(self, prof: profile, window: ProfileWindow) -> list[WindowSummary]:
        raw_path = Path(window.trace_root) / f".raw-rank{self.rank}-{window.label}.json"
        raw_path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(raw_path))
        try:
            raw = read_trace(raw_path)
        finally:
            raw_path.unlink(missing_ok=True)
        memory = window.memory_file(self.rank)
        summaries = []
        markers = [e for e in raw.get("traceEvents", []) if str(e.get("name", "")).startswith(MARK)]
        for i, target in enumerate(window.targets):
            if not self.rollouts[target]:
                continue
            mine = [e for e in markers if e["name"].rsplit("#", 1)[0] == MARK + target]
            others = {e["name"] for e in markers} - {e["name"] for e in mine}
            sliced = slice_trace(raw, [(e["ts"], e["ts"] + e.get("dur", 0)) for e in mine], others)
            for e in sliced["traceEvents"]:
                if str(e.get("name", "")).startswith(MARK):
                    e["name"] = "ProfilerStep#" + e["name"].rsplit("#", 1)[1]
            path = window.trace_path(target, self.rank, self.coords)
            write_trace(sliced, path)
            done = self.rollouts[target]
            summaries.append(summarize_trace(path, target=target, rank=self.rank, start=min(done),
                                             end=max(done) + 1, run_dir=Path(window.run_dir),
                                             memory=memory if i == 0 else None, trace=sliced))
        if memory is not None and not torch.cuda.is_available():
            write_memory_timeline(raw, memory)
        return summaries


def write_memory_timeline(trace: dict, path: Path) -> None:
    """The CPU memory timeline of a window from the profiler's allocation events (profile_memory):
    {"device", "events": [[ts_us, bytes, total_allocated], ...], "peak_allocated"}, as JSON for a
    `.json`/`.json.gz` name, else pickled (Miles' `snapshot.pickle`)."""
    events = [[e["ts"], e["args"].get("Bytes", 0), e["args"].get("Total Allocated", 0)]
              for e in trace.get("traceEvents", []) if e.get("name") == "[memory]" and "args" in e]
    events.sort()
    timeline = {"device": "cpu", "unit": "bytes", "events": events,
                "peak_allocated": max((e[2] for e in events), default=0)}
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".json.gz"):
        write_trace(timeline, path)
    elif path.name.endswith(".json"):
        path.write_text(json.dumps(timeline))
    else:
        with open(path, "wb") as f:
            pickle.dump(timeline, f)
