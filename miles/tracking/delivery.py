"""The delivery worker: moves committed journal lines into each tracker, keeps going when a
tracker fails, and catches it up when it is back. It runs in the delivery process (see
`delivery_process`), never in the training process, and in `miles replay-spool`.

Per tracker a cursor counts the journal lines it holds. A failure is reported once per
outage; the lines simply stay behind the cursor (in the journal on disk) and the worker
retries every `retry_interval` seconds. Nothing here ever raises into its caller's thread.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from miles.tracking.journal import JOURNAL_NAME, JournalFollower
from miles.tracking.samples import existing_samples
from miles.tracking.secrets import Scrubber
from miles.tracking.sinks.base import Delivery, Sink, SinkSpec, build_sink
from miles.tracking.state import CONFIG_ARTIFACT, DeliveryState, SinkState, pending

log = logging.getLogger("miles.tracking")
LINES_PER_DELIVERY = 50


@dataclass
class Slot:
    """One tracker and where its delivery stands."""

    sink: Sink
    state: SinkState
    opened: bool = False
    down_since: float | None = None
    next_try: float = 0.0

    @property
    def name(self) -> str:
        return self.sink.name


@dataclass(frozen=True)
class FinishReport:
    undelivered: dict[str, int] = field(default_factory=dict)  # tracker -> committed lines still spooled


def warn_spooled(undelivered: dict[str, int], run_dir: Path) -> None:
    for name, count in undelivered.items():
        log.warning("tracking: %d committed lines for %s are still spooled; deliver them with "
                    "`miles replay-spool %s`", count, name, run_dir)


class DeliveryWorker:
    def __init__(self, sinks: list[Sink], state: DeliveryState, journal: JournalFollower, committed: int,
                 samples_for: Callable[[int], Path | None], scrubber: Scrubber, retry_interval: float = 2.0,
                 on_open: Callable[[str, SinkSpec], None] | None = None):
        self.state, self.journal, self.committed = state, journal, committed
        self.samples_for, self.scrubber, self.on_open = samples_for, scrubber, on_open
        self.retry_interval = retry_interval
        self.slots = []
        for sink in sinks:
            sink_state = state.sinks.setdefault(sink.name, SinkState(sink.spec()))
            self.slots.append(Slot(sink, sink_state))
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="miles-tracking-delivery", daemon=True)
        self.finished = threading.Event()
        self.report: FinishReport | None = None  # set by the finish; else computed from the cursors

    def start(self) -> None:
        self.thread.start()

    def submit(self, committed: int) -> None:
        """The journal's first `committed` lines are committed: deliver them."""
        self.queue.put(("commit", committed))

    def finish(self, files: list[Path], timeout: float, committed: int | None = None,
               final: bool = True) -> FinishReport:
        """Deliver what is committed (retrying a failed tracker until `timeout`), upload `files`,
        finish every tracker run. What could not be delivered stays spooled. Not `final`: the
        run goes on in a later process (the next chunk), which reopens the same tracker runs."""
        self.queue.put(("finish", (files, time.monotonic() + timeout, committed, final)))
        self.finished.wait()
        return self.report or FinishReport(self._pending())

    def abandon(self) -> None:
        """Stop after the delivery in progress, leaving tracker runs as a kill would (resumable)."""
        self.queue.put(("abandon", None))

    # -- worker thread --------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                waiting = any(s.down_since is not None for s in self.slots)
                try:
                    kind, payload = self.queue.get(timeout=self.retry_interval if waiting else None)
                except queue.Empty:
                    kind, payload = "retry", None
                if kind == "abandon":
                    return
                if kind == "finish":
                    self._finish(*payload)
                    return
                if kind == "commit":
                    self.committed = max(self.committed, payload)
                    if not self.queue.empty():
                        continue  # a later commit or the finish supersedes this one
                for slot in self.slots:
                    self._catch_up(slot)
        except BaseException:  # the worker must not die silently; training goes on regardless
            log.error("tracking delivery stopped: %s", self.scrubber.scrub(traceback.format_exc()))
        finally:
            self.finished.set()

    def _catch_up(self, slot: Slot, force: bool = False) -> bool:
        if slot.down_since is not None and not force and time.monotonic() < slot.next_try:
            return False
        try:
            if not slot.opened:
                slot.sink.open()
                slot.opened = True
                slot.state.spec = slot.sink.spec()  # now with its run id
                slot.state.uploaded = False  # the run is open again until this process finishes it
                slot.state.cursor = slot.sink.durable_cursor(slot.state.cursor)
                self.state.save()
                if self.on_open is not None:
                    self.on_open(slot.name, slot.state.spec)
            lines = self.journal.read_through(self.committed)
            while slot.state.cursor < len(lines):
                start = slot.state.cursor
                end = min(len(lines), start + LINES_PER_DELIVERY)
                slot.sink.deliver(self._delivery(lines, start, end))
                slot.state.cursor = end
                self.state.save()
        except Exception as exc:
            self._report_down(slot, exc)
            return False
        if slot.down_since is not None:
            log.warning("tracking: %s is back after %.0fs; spooled points delivered",
                        slot.name, time.monotonic() - slot.down_since)
            slot.down_since = None
        return True

    def _delivery(self, lines: list, start: int, end: int) -> Delivery:
        samples = {}
        for i in range(start, end):
            first_of_rollout = i == 0 or lines[i - 1].rollout_id != lines[i].rollout_id
            path = self.samples_for(lines[i].rollout_id) if first_of_rollout else None
            if path is not None:
                samples[i - start] = path
        return Delivery(lines[start:end], samples)

    def _pending(self) -> dict[str, int]:
        return pending(self.committed, {s.name: s.state for s in self.slots})

    def _report_down(self, slot: Slot, exc: Exception) -> None:
        if slot.down_since is None:  # once per outage
            slot.down_since = time.monotonic()
            log.warning("tracking: %s failed (%s: %s); training goes on, its points stay spooled in the journal "
                        "and are delivered when it is back (or by `miles replay-spool RUN_DIR`)",
                        slot.name, type(exc).__name__, self.scrubber.scrub(str(exc))[:500])
            log.debug("%s", self.scrubber.scrub(traceback.format_exc()))
        slot.next_try = time.monotonic() + self.retry_interval

    def _finish(self, files: list[Path], deadline: float, committed: int | None, final: bool = True) -> None:
        if committed is not None:
            self.committed = max(self.committed, committed)
        for slot in self.slots:
            while not self._catch_up(slot, force=True) and time.monotonic() < deadline:
                time.sleep(min(self.retry_interval, max(0.0, deadline - time.monotonic())))
            if slot.down_since is None and slot.opened:
                try:
                    slot.sink.upload([f for f in files if f.exists()])
                    slot.sink.close()
                    slot.state.uploaded = final
                    self.state.save()
                except Exception as exc:
                    self._report_down(slot, exc)
        self.report = FinishReport(self._pending())
        warn_spooled(self.report.undelivered, self.state.path.parent.parent)


def worker_for(run_dir: Path, state: DeliveryState, specs: dict[str, SinkSpec], committed: int, scrubber: Scrubber,
               retry_interval: float, secret_options: dict[str, dict] | None = None,
               on_open: Callable[[str, SinkSpec], None] | None = None) -> DeliveryWorker:
    """A worker that delivers `run_dir`'s journal to the trackers in `specs`, built with the run's
    public config as their params (the delivery process and `miles replay-spool` both use it)."""
    config_path = run_dir / CONFIG_ARTIFACT
    params = yaml.safe_load(config_path.read_text()) if config_path.exists() else {}
    sinks = []
    for name, spec in specs.items():
        sink = build_sink(spec, params, **(secret_options or {}).get(name, {}))
        sink.name = name
        sinks.append(sink)
    return DeliveryWorker(sinks, state, JournalFollower(run_dir / JOURNAL_NAME), committed,
                          lambda rid: existing_samples(run_dir, rid), scrubber, retry_interval=retry_interval,
                          on_open=on_open)
