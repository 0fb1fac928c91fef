"""The background delivery worker: moves committed journal lines into each tracker off the
training thread, keeps going when a tracker fails, and catches it up when it is back.

Per tracker a cursor counts the journal lines it holds. A failure is reported once per
outage; the lines simply stay behind the cursor (in the journal on disk) and the worker
retries every `retry_interval` seconds. Nothing here ever raises into training.
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

from miles.tracking.journal import JournalLine
from miles.tracking.secrets import Scrubber
from miles.tracking.sinks.base import Delivery, Sink
from miles.tracking.state import SinkState, TrackingState

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


class DeliveryWorker:
    def __init__(self, sinks: list[Sink], state: TrackingState, lines: list[JournalLine],
                 samples_for: Callable[[int], Path | None], scrubber: Scrubber, retry_interval: float = 2.0):
        self.state, self.lines, self.samples_for, self.scrubber = state, lines, samples_for, scrubber
        self.retry_interval = retry_interval
        self.slots = []
        for sink in sinks:
            sink_state = state.sinks.setdefault(sink.name, SinkState(sink.spec()))
            self.slots.append(Slot(sink, sink_state))
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="miles-tracking-delivery", daemon=True)
        self.finished = threading.Event()
        self.report = FinishReport()

    def start(self) -> None:
        self.thread.start()

    def submit(self) -> None:
        """New lines are committed (already in `state.committed`): deliver them."""
        self.queue.put(("commit", None))

    def finish(self, files: list[Path], timeout: float) -> FinishReport:
        """Deliver what is committed (retrying a failed tracker until `timeout`), upload `files`,
        finish every tracker run. What could not be delivered stays spooled."""
        self.queue.put(("finish", (files, time.monotonic() + timeout)))
        self.finished.wait()
        return self.report

    # -- worker thread --------------------------------------------------------
    def _run(self) -> None:
        # not niced: a low-priority thread descheduled while holding the GIL would stall training
        try:
            while True:
                waiting = any(s.down_since is not None for s in self.slots)
                try:
                    kind, payload = self.queue.get(timeout=self.retry_interval if waiting else None)
                except queue.Empty:
                    kind, payload = "retry", None
                if kind == "finish":
                    self._finish(*payload)
                    return
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
                slot.state.cursor = slot.sink.durable_cursor(slot.state.cursor)
                self.state.save()
            while slot.state.cursor < self.state.committed:
                start = slot.state.cursor
                end = min(self.state.committed, start + LINES_PER_DELIVERY)
                slot.sink.deliver(self._delivery(start, end))
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

    def _delivery(self, start: int, end: int) -> Delivery:
        chunk = self.lines[start:end]
        samples = {}
        for i, line in enumerate(chunk):
            first_of_rollout = start + i == 0 or self.lines[start + i - 1].rollout_id != line.rollout_id
            path = self.samples_for(line.rollout_id) if first_of_rollout else None
            if path is not None:
                samples[i] = path
        return Delivery(chunk, samples)

    def _report_down(self, slot: Slot, exc: Exception) -> None:
        if slot.down_since is None:  # once per outage
            slot.down_since = time.monotonic()
            log.warning("tracking: %s failed (%s: %s); training goes on, its points stay spooled in the journal "
                        "and are delivered when it is back (or by `miles replay-spool RUN_DIR`)",
                        slot.name, type(exc).__name__, self.scrubber.scrub(str(exc))[:500])
            log.debug("%s", self.scrubber.scrub(traceback.format_exc()))
        slot.next_try = time.monotonic() + self.retry_interval

    def _finish(self, files: list[Path], deadline: float) -> None:
        self.state.artifacts = [str(f) for f in files]
        self.state.save()
        for slot in self.slots:
            while not self._catch_up(slot, force=True) and time.monotonic() < deadline:
                time.sleep(min(self.retry_interval, max(0.0, deadline - time.monotonic())))
            if slot.down_since is None and slot.opened:
                try:
                    slot.sink.upload([f for f in files if f.exists()])
                    slot.sink.close()
                    slot.state.uploaded = True
                    self.state.save()
                except Exception as exc:
                    self._report_down(slot, exc)
        self.report = FinishReport(self.state.pending())
        for name, count in self.report.undelivered.items():
            log.warning("tracking: %d committed lines for %s are still spooled; deliver them with "
                        "`miles replay-spool %s`", count, name, self.state.path.parent.parent)
