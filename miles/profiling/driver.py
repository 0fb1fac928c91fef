"""The trainer's side of profiling: opens windows on the ranks and engines at their rollouts, marks the
trainer's phases, closes windows into traces and summaries; runs the py-spy dumps and the Ray timeline.

Outside a window every call is a comparison or a shared no-op context: nothing profiles, nothing
waits. A failure (disk full, an export error) is printed once and the window dropped; training goes on.
"""
from __future__ import annotations

import json
import logging
import os
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import httpx
import ray

from miles.run.observer import Observer
from miles.run.phases import add_phase_hook, remove_phase_hook
from miles.profiling import pyspy
from miles.profiling.ray_timeline import save_ray_timeline
from miles.profiling.run_services import write_services
from miles.profiling.summary import WindowSummary, append_summaries, format_table, summarize_trace
from miles.profiling.window import ProfileWindow, profiler_dir, window_from_config
from miles.record import layout
from miles.serving.auth import bearer
from miles.serving.control_http import control_client

log = logging.getLogger(__name__)
_IDLE = nullcontext()
TRAINER_SPANS = ("rollout", "update_weights", "checkpoint", "eval")  # log_probs, actor_train: inside the ranks
REQUESTED = Path(layout.PROFILER_REQUESTED).name  # windows asked for while training (request_window), for later chunks


def requested(run_dir: Path) -> list[tuple[int, int]]:
    path = profiler_dir(run_dir) / REQUESTED
    if not path.exists():
        return []
    return [(w["start"], w["end"]) for w in map(json.loads, path.read_text().splitlines()) if w]


class RunProfiler(Observer):
    """Profiling for one trainer: the configured window, windows asked for later, py-spy, Ray timeline.
    A loop observer (windows open and close at iterations, everything stops at the loop's end) and a
    phase hook (the trainer's phases become spans of `train_overall`)."""

    def __init__(self, config, run_dir: Path, actors: list, engine_urls: list[str], router_url: str | None = None,
                 admin_token: str | None = None):
        self.config, self.run_dir = config, Path(run_dir)
        self.actors, self.engine_urls, self.router_url = actors, engine_urls, router_url
        self.admin_token = admin_token
        p = config.profiling
        self.pending: list[ProfileWindow] = [window_from_config(config, run_dir)] if p.use_pytorch_profiler else []
        self.pending += [window_from_config(config, run_dir, start, end) for start, end in requested(self.run_dir)]
        self.active: ProfileWindow | None = None
        self.ranks: list = []  # the actors profiling the active window
        self.engines: list[str] = []  # engines profiling the active window
        self.overall = False
        self.first: int | None = None  # the active window's first and latest rollout run here
        self.last_rollout: int | None = None
        self.reported: set[str] = set()
        self.summaries: list[WindowSummary] = []  # every window closed by this trainer
        self.dumps = None
        self.closed = False
        if p.py_spy_interval is not None:
            self.dumps = pyspy.PeriodicDumps(self.run_dir, p.py_spy_interval, self.processes).start()
        self._record_processes()
        add_phase_hook(self.phase)

    # ---- the loop's observer interface --------------------------------------------------------
    def before_iteration(self, rollout_id: int) -> None:
        self.begin_iteration(rollout_id)

    def end(self, outcome) -> None:
        self.close()

    # ---- windows ------------------------------------------------------------------------------
    def request_window(self, start: int, end: int) -> ProfileWindow:
        """Profile rollouts [start, end) with the configured targets and ranks, from the next iteration
        in it (the health watch's `--on-red-flag profile` calls this)."""
        if end <= start:
            raise ValueError(f"a profiling window needs end > start, got [{start}, {end})")
        window = window_from_config(self.config, self.run_dir, start, end)
        self.pending.append(window)
        self._guard(lambda: self._remember(start, end))
        return window

    def _remember(self, start: int, end: int) -> None:
        path = profiler_dir(self.run_dir) / REQUESTED
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:  # the next chunk's trainer (another process, maybe) finds it here
            f.write(json.dumps({"start": start, "end": end}) + "\n")

    def begin_iteration(self, rollout_id: int) -> None:
        """Called before each iteration: closes a window that ended, opens one that starts here."""
        if self.active is not None and rollout_id not in self.active:
            self.close_window()
        self.last_rollout = rollout_id
        if self.active is None and self.pending:
            self.pending = [w for w in self.pending if w.end > rollout_id]  # passed windows never open
            due = next((w for w in self.pending if rollout_id in w), None)
            if due is not None:
                self.pending.remove(due)
                # resumed inside the window: profile (and name the files after) what is left of it
                self._open(replace(due, start=rollout_id))
        if self.overall:
            self._guard(lambda: ray.get([a.profile_iteration.remote(rollout_id) for a in self.ranks]))

    def phase(self, name: str):
        """A context naming a trainer phase as a span of train_overall (a shared no-op otherwise)."""
        if not self.overall or name not in TRAINER_SPANS:
            return _IDLE
        return self._span(name)

    @contextmanager
    def _span(self, name: str) -> Iterator[None]:
        self._guard(lambda: ray.get([a.profile_span.remote(name, True) for a in self.ranks]))
        try:
            yield
        finally:
            if self.overall:
                self._guard(lambda: ray.get([a.profile_span.remote(name, False) for a in self.ranks]))

    def _open(self, window: ProfileWindow) -> None:
        def open_ranks():
            chosen = [self.actors[r] for r in window.ranks if r < len(self.actors)]
            self.ranks = [a for a, on in zip(chosen, ray.get([a.profile_open.remote(window) for a in chosen])) if on]
            return True

        self.active, self.first = window, self.last_rollout
        if not self._guard(open_ranks):
            return
        self.overall = "train_overall" in window.targets and bool(self.ranks)
        if self.config.profiling.profile_rollout:
            self._guard(lambda: self._start_engines(window))
        print(f"[profiler] window {window.label} open: {', '.join(window.targets)} on ranks "
              f"{list(window.ranks)}" + (f" and {len(self.engines)} engines" if self.engines else ""), flush=True)

    def close_window(self) -> list[WindowSummary]:
        """Stop the active window everywhere; write and print its summaries."""
        window, self.active, self.overall = self.active, None, False
        if window is None:
            return []
        summaries: list[WindowSummary] = []
        ranks, self.ranks = self.ranks, []
        end = self.last_rollout + 1  # earlier than window.end when the run or chunk ends inside it
        for result in self._guard(lambda: ray.get([a.profile_close.remote(end) for a in ranks])) or []:
            found, error = result
            summaries += found
            if error:
                self._report(f"window {window.label}: {error}")
        engines, self.engines = self.engines, []
        if engines:
            summaries += self._guard(lambda: self._stop_engines(window, engines)) or []
        if summaries:
            self._guard(lambda: append_summaries(self.run_dir, summaries))
            print(format_table(summaries), flush=True)
        self.summaries += summaries
        return summaries

    # ---- engines ------------------------------------------------------------------------------
    def _engine_urls(self) -> list[str]:
        """The engines behind the router (its /list_workers), or the trainer's own list."""
        if self.router_url is None:
            return list(self.engine_urls)
        answer = control_client().get(f"{self.router_url}/list_workers", headers=self._headers(), timeout=30.0)
        answer.raise_for_status()
        return [u.rstrip("/") for u in answer.json()["urls"]]

    def _start_engines(self, window: ProfileWindow) -> None:
        out = window.engine_trace_dir()
        for i, url in enumerate(self._engine_urls()):
            control_client().post(f"{url}/start_profile", json={"output_dir": str(out), "profile_id": f"engine{i}",
                                                     "activities": ["CPU", "GPU"]},
                       headers=self._headers(), timeout=60.0).raise_for_status()
            self.engines.append(url)

    def _stop_engines(self, window: ProfileWindow, engines: list[str]) -> list[WindowSummary]:
        summaries = []
        for i, url in enumerate(engines):
            control_client().post(f"{url}/stop_profile", headers=self._headers(), timeout=300.0).raise_for_status()
            path = window.engine_trace_dir() / f"engine{i}-TP-0.trace.json.gz"
            summaries.append(summarize_trace(path, target="rollout", rank=i, start=self.first,
                                             end=self.last_rollout + 1, run_dir=self.run_dir))
        return summaries

    # ---- processes, py-spy, Ray timeline ---------------------------------------------------------
    def processes(self) -> dict[str, int]:
        """The run's processes: this trainer, its training ranks, the engines and the router."""
        found = {"trainer": os.getpid()}
        for rank, info in enumerate(ray.get([a.info.remote() for a in self.actors]) if self.actors else []):
            found[f"rank{rank}"] = info.extra["pid"]
        for i, url in enumerate(self.engine_urls):
            pid = self._pid(f"{url}/get_server_info")
            if pid is not None:
                found[f"engine{i}"] = pid
        if self.router_url is not None:
            pid = self._pid(f"{self.router_url}/router_health")
            if pid is not None:
                found["router"] = pid
        return found

    def _headers(self) -> dict[str, str]:
        return bearer(self.admin_token)

    def _pid(self, url: str) -> int | None:
        try:
            return control_client().get(url, headers=self._headers(), timeout=10.0).json().get("pid")
        except (httpx.HTTPError, ValueError, AttributeError):
            return None  # an engine without a pid field (SGLang) or a service that went away

    def _record_processes(self) -> None:
        self._guard(lambda: pyspy.write_processes(self.run_dir, self.processes()))
        self._guard(lambda: write_services(self.run_dir, self.engine_urls, self.router_url))

    def close(self) -> None:
        """End of the run or chunk: close an open window, stop the dumps, save the Ray timeline (once)."""
        if self.closed:
            return
        self.closed = True
        remove_phase_hook(self.phase)
        if self.active is not None:
            self.close_window()
        if self.dumps is not None:
            self.dumps.stop()
            self.dumps = None
        if self.config.profiling.ray_timeline and ray.is_initialized():
            path = self._guard(lambda: save_ray_timeline(self.run_dir))
            if path is not None:
                print(f"[profiler] Ray timeline: {path}", flush=True)

    # ---- failures -----------------------------------------------------------------------------
    def _guard(self, fn):
        """Run a profiling step; on failure report it once, drop the window, and let training go on."""
        try:
            return fn()
        except Exception as exc:
            self._report(f"{type(exc).__name__}: {exc}")
            if self.active is not None:
                self._abandon()
            return None

    def _abandon(self) -> None:
        """Drop the active window after a failure, stopping what still runs (best effort, no report)."""
        ranks, engines = self.ranks, self.engines
        self.active, self.overall, self.ranks, self.engines = None, False, [], []
        try:
            ray.get([a.profile_close.remote() for a in ranks])
            for url in engines:
                control_client().post(f"{url}/stop_profile", headers=self._headers(), timeout=60.0)
        except Exception:  # already reported the first failure; the rest is cleanup
            log.debug("cleanup after a profiling failure failed", exc_info=True)

    def _report(self, message: str) -> None:
        if message not in self.reported:
            self.reported.add(message)
            print(f"[profiler] error, profiling skipped, training goes on: {message}", flush=True)
            log.warning("profiling failed: %s", message)
