"""The delivery loop of `miles replay-spool`: moves journal lines into each tracker as they are
recorded, single-threaded, reading the trainer's `trainer.json` and writing only `delivery.json`.

Per tracker a cursor counts the journal lines it holds. A failure is logged once per outage;
the lines stay behind the cursor (in the journal on disk) and are retried every
`retry_interval` seconds, so training never waits on a tracker.
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
from miles.tracking.state import CONFIG_ARTIFACT, TRAINER_PATH, DeliveryState, SinkState, TrainerFile, pending

log = logging.getLogger("miles.tracking")
LINES_PER_DELIVERY = 50
POLL_S = 0.5  # how often the journal, trainer.json and the trainer's liveness are checked while following
# Following, a delivery waits this long after the previous one, so frequent lines go out in one
# call per tracker: MLflow's SQL store spends ~4x less CPU per point in a batch of a few lines.
BATCH_S = 4.0


@dataclass
class Slot:
    """One tracker and where its delivery stands."""

    name: str
    sink: Sink
    state: SinkState
    opened: bool = False
    down_since: float | None = None
    next_try: float = 0.0


class DeliveryLoop:
    """Delivers one run directory's journal to `specs`; the caller holds the delivery lock."""

    def __init__(self, run_dir: Path, specs: dict[str, SinkSpec], scrubber: Scrubber, retry_interval: float,
                 session: str | None = None):
        self.run_dir, self.scrubber, self.retry_interval, self.session = run_dir, scrubber, retry_interval, session
        self.trainer_file, self.state = TrainerFile.load(run_dir), DeliveryState.load(run_dir)
        self.journal = JournalFollower(run_dir / JOURNAL_NAME)
        config = run_dir / CONFIG_ARTIFACT
        params = yaml.safe_load(config.read_text()) if config.exists() else {}
        self.slots = [Slot(name, build_sink(spec, params), self.state.sinks.setdefault(name, SinkState(spec)))
                      for name, spec in specs.items()]
        self._seen: tuple | None = None

    def refresh(self) -> None:
        """Read the journal's new lines, and trainer.json when it changed (one stat per poll otherwise)."""
        self.journal.read()
        try:
            st = os.stat(self.run_dir / TRAINER_PATH)
        except FileNotFoundError:
            return
        if (st.st_mtime_ns, st.st_size, st.st_ino) != self._seen:
            self._seen = (st.st_mtime_ns, st.st_size, st.st_ino)
            self.trainer_file = TrainerFile.load(self.run_dir)

    def trainer_state(self) -> str:
        """"closed" (its close is asked for), "gone" (dead, or another trainer took the run over),
        "open" (it read its checkpoint) or "starting"."""
        trainer = self.trainer_file.trainer or {}
        if (self.trainer_file.close or {}).get("session") == self.session:
            return "closed"
        if trainer.get("session") != self.session or not self.trainer_file.trainer_alive():
            return "gone"
        return "open" if trainer.get("open") else "starting"

    def follow(self) -> str:
        """Deliver lines as they are recorded until the trainer's close ("closed") or its end ("gone":
        it died, or another trainer took the run over)."""
        next_delivery = 0.0
        while True:
            self.refresh()
            if time.monotonic() >= next_delivery and (self.pending() or not all(s.opened for s in self.slots)):
                self.catch_up_all()
                next_delivery = time.monotonic() + BATCH_S
            status = self.trainer_state()
            if status == "gone":
                self.refresh()
                self.catch_up_all()  # what it recorded last, before leaving
            if status != "open":
                return status
            time.sleep(POLL_S)  # the poll interval: a new line is seen within it

    def catch_up_all(self) -> None:
        for slot in self.slots:
            self.catch_up(slot)

    def catch_up(self, slot: Slot, force: bool = False) -> bool:
        if slot.down_since is not None and not force and time.monotonic() < slot.next_try:
            return False
        try:
            if not slot.opened:
                slot.sink.open()
                slot.opened = True
                slot.state.spec = slot.sink.spec()  # now with its run id
                slot.state.uploaded = False  # the run is open again until this process finishes it
                slot.state.session = self.session
                slot.state.cursor = slot.sink.durable_cursor(slot.state.cursor)
                self.state.save()
                log.info("tracking: %s open %s", slot.name, slot.state.spec.options)
            lines = self.journal.read()
            while slot.state.cursor < len(lines):
                start = slot.state.cursor
                end = min(len(lines), start + LINES_PER_DELIVERY)
                slot.sink.deliver(self._delivery(lines, start, end))
                slot.state.cursor = end
                self.state.save()
        except Exception as exc:
            if slot.down_since is None:  # once per outage
                slot.down_since = time.monotonic()
                log.warning("tracking: %s failed (%s: %s); training goes on, its points stay spooled in the journal "
                            "and are delivered when it is back (or by `miles replay-spool RUN_DIR`)",
                            slot.name, type(exc).__name__, self.scrubber.scrub(str(exc))[:500])
                log.debug("%s", self.scrubber.scrub(traceback.format_exc()))
            slot.next_try = time.monotonic() + self.retry_interval
            return False
        if slot.down_since is not None:
            log.warning("tracking: %s is back after %.0fs; spooled points delivered",
                        slot.name, time.monotonic() - slot.down_since)
            slot.down_since = None
        return True

    def _delivery(self, lines: list, start: int, end: int) -> Delivery:
        """Lines start..end, with each rollout's sample table on its first line."""
        samples = {i - start: existing_samples(self.run_dir, lines[i].rollout_id) for i in range(start, end)
                   if i == 0 or lines[i - 1].rollout_id != lines[i].rollout_id}
        return Delivery(lines[start:end], {i: p for i, p in samples.items() if p is not None}, first=start)

    def finish(self, files: list[Path], timeout: float, final: bool = True) -> dict[str, int]:
        """Deliver the journal (retrying a failed tracker until `timeout`), upload `files` when
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
                    log.warning("tracking: %s could not finish its run (%s: %s); `miles replay-spool %s` does it",
                                slot.name, type(exc).__name__, self.scrubber.scrub(str(exc))[:500], self.run_dir)
        return self.pending()

    def pending(self) -> dict[str, int]:
        return pending(len(self.journal.read()), {s.name: s.state for s in self.slots})
