"""The delivery loop of `miles replay-spool`: moves committed journal lines into each tracker,
keeps going when a tracker fails and catches it up when it is back; single-threaded, reading
the trainer's `committed.json` and writing only `delivery.json` (see `state`).

Per tracker a cursor counts the journal lines it holds. A failure is reported once per
outage; the lines simply stay behind the cursor (in the journal on disk) and are retried
every `retry_interval` seconds.
"""
from __future__ import annotations

import logging
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import yaml

from miles.tracking.journal import JOURNAL_NAME, JournalFollower
from miles.tracking.samples import existing_samples
from miles.tracking.secrets import Scrubber
from miles.tracking.sinks.base import Delivery, Sink, SinkSpec, build_sink
from miles.tracking.state import COMMITTED_PATH, CONFIG_ARTIFACT, CommitState, DeliveryState, SinkState, pending

log = logging.getLogger("miles.tracking")
LINES_PER_DELIVERY = 50
POLL_S = 0.5  # how often committed.json and the trainer's liveness are checked while following


@dataclass
class Slot:
    """One tracker and where its delivery stands."""

    name: str
    sink: Sink
    state: SinkState
    opened: bool = False
    down_since: float | None = None
    next_try: float = 0.0


def merged_spec(asked: SinkSpec | None, known: SinkState | None) -> SinkSpec:
    """The trainer's spec, with the run id the delivery state knows when the trainer had none."""
    if asked is None:
        return known.spec
    run_id = known.spec.options.get("run_id") if known is not None and known.spec.kind == asked.kind else None
    if run_id and not asked.options.get("run_id"):
        return SinkSpec(asked.kind, {**asked.options, "run_id": run_id})
    return asked


class DeliveryLoop:
    """Delivers one run directory's committed lines; the caller holds the delivery lock."""

    def __init__(self, run_dir: Path, names: list[str], scrubber: Scrubber, retry_interval: float,
                 session: str | None = None):
        self.run_dir, self.scrubber, self.retry_interval, self.session = run_dir, scrubber, retry_interval, session
        self.commits = CommitState.load(run_dir)
        self.state = DeliveryState.load(run_dir)
        self.journal = JournalFollower(run_dir / JOURNAL_NAME)
        config_path = run_dir / CONFIG_ARTIFACT
        params = yaml.safe_load(config_path.read_text()) if config_path.exists() else {}
        self.slots = []
        for name in names:
            spec = merged_spec(self.commits.trackers.get(name), self.state.sinks.get(name))
            sink_state = self.state.sinks.setdefault(name, SinkState(spec))
            self.slots.append(Slot(name, build_sink(spec, params), sink_state))
        self._seen: tuple | None = None
        self._cut_back()

    # -- following the trainer ---------------------------------------------------
    def refresh(self) -> None:
        """Re-read committed.json when it changed (a stat per poll otherwise)."""
        try:
            st = os.stat(self.run_dir / COMMITTED_PATH)
        except FileNotFoundError:
            return
        if (st.st_mtime_ns, st.st_size, st.st_ino) != self._seen:
            self._seen = (st.st_mtime_ns, st.st_size, st.st_ino)
            self.commits = CommitState.load(self.run_dir)
            self._cut_back()

    def _cut_back(self) -> None:
        if len(self.journal.lines) > self.commits.committed:  # a resume cut the journal before them
            self.journal = JournalFollower(self.run_dir / JOURNAL_NAME)
        for slot in self.slots:
            if slot.state.cursor > self.commits.committed:
                log.warning("tracking: %s already holds %d lines past the checkpoint; the redone rollouts are "
                            "delivered again", slot.name, slot.state.cursor - self.commits.committed)
                slot.state.cursor = self.commits.committed

    def trainer_state(self) -> str:
        """"closed" (its close is asked for), "gone" (dead, or another trainer took the run over) or "running"."""
        trainer, close = self.commits.trainer or {}, self.commits.close or {}
        if close.get("session") == self.session:
            return "closed"
        if trainer.get("session") != self.session or not self.commits.trainer_alive():
            return "gone"
        return "running"

    def follow(self) -> str:
        """Deliver as commits come until the trainer closes or is gone; returns which."""
        while True:
            self.refresh()
            self.catch_up_all()
            status = self.trainer_state()
            if status != "running":
                return status
            time.sleep(POLL_S)  # the poll interval: commits are seen within it

    # -- delivery ----------------------------------------------------------------
    def catch_up_all(self, force: bool = False) -> None:
        for slot in self.slots:
            self.catch_up(slot, force)

    def catch_up(self, slot: Slot, force: bool = False) -> bool:
        if slot.down_since is not None and not force and time.monotonic() < slot.next_try:
            return False
        try:
            if not slot.opened:
                self._open(slot)
            lines = self.journal.read_through(self.commits.committed)
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

    def _open(self, slot: Slot) -> None:
        slot.sink.open()
        slot.opened = True
        slot.state.spec = slot.sink.spec()  # now with its run id
        slot.state.uploaded = False  # the run is open again until this process finishes it
        slot.state.session = self.session
        slot.state.cursor = min(self.commits.committed, slot.sink.durable_cursor(slot.state.cursor))
        self.state.save()
        log.info("tracking: %s open %s", slot.name, slot.state.spec.options)

    def _delivery(self, lines: list, start: int, end: int) -> Delivery:
        samples = {}
        for i in range(start, end):
            first_of_rollout = i == 0 or lines[i - 1].rollout_id != lines[i].rollout_id
            path = existing_samples(self.run_dir, lines[i].rollout_id) if first_of_rollout else None
            if path is not None:
                samples[i - start] = path
        return Delivery(lines[start:end], samples, first=start)

    def _report_down(self, slot: Slot, exc: Exception) -> None:
        if slot.down_since is None:  # once per outage
            slot.down_since = time.monotonic()
            log.warning("tracking: %s failed (%s: %s); training goes on, its points stay spooled in the journal "
                        "and are delivered when it is back (or by `miles replay-spool RUN_DIR`)",
                        slot.name, type(exc).__name__, self.scrubber.scrub(str(exc))[:500])
            log.debug("%s", self.scrubber.scrub(traceback.format_exc()))
        slot.next_try = time.monotonic() + self.retry_interval

    def finish(self, files: list[Path], timeout: float, final: bool = True) -> dict[str, int]:
        """Deliver what is committed (retrying a failed tracker until `timeout`), upload `files` when
        `final`, finish every tracker run; returns what is still spooled per tracker. Not `final`:
        the run goes on in a later process (the next chunk), which reopens the same tracker runs."""
        deadline = time.monotonic() + timeout
        for slot in self.slots:
            while not self.catch_up(slot, force=True) and time.monotonic() < deadline:
                time.sleep(min(self.retry_interval, max(0.0, deadline - time.monotonic())))
            if slot.down_since is None and slot.opened:
                try:
                    slot.sink.upload([f for f in files if f.exists()] if final else [])
                    slot.sink.close()
                    slot.state.uploaded = final
                    self.state.save()
                except Exception as exc:
                    self._report_down(slot, exc)
        return self.pending()

    def pending(self) -> dict[str, int]:
        return pending(self.commits.committed, {s.name: s.state for s in self.slots})
