"""The tracking state of a run directory: besides the journal, two files with one writer each, the
only protocol between the trainer and its delivery process (`miles replay-spool RUN_DIR --follow`).

- `RUN_DIR/tracking/trainer.json`, written only by the trainer: the trackers that are on
  (`trackers`, their specs), the trainer process that owns the run now (`trainer`: pid, start
  time, session, and `open` once it read its checkpoint: before that the delivery process only
  prepares), the files to upload at the end (`artifacts`) and, once the trainer closes, how (`close`);
- `RUN_DIR/tracking/delivery.json`, written only by whoever holds `RUN_DIR/tracking/delivery.lock`
  (the delivery process or `miles replay-spool`): per tracker its spec (run id included), how
  many journal lines it holds (`cursor`), the session that last opened it and whether its run is
  finished with the artifacts stored (`uploaded`).

A tracker's spool is the journal (`metrics.jsonl`, append-only) past its cursor.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from miles.record import layout
from miles.record.files import write_atomic
from miles.record.journal import JOURNAL_NAME, read_journal
from miles.tracking.sinks.base import SinkSpec

log = logging.getLogger("miles.tracking")
CONFIG_ARTIFACT = Path(layout.TRACKING_CONFIG)  # the public (redacted) config: tracker params, an artifact
TRAINER_PATH = Path(layout.TRAINER_STATE)
DELIVERY_PATH = Path(layout.DELIVERY_STATE)
DELIVERY_LOCK_PATH = Path(layout.DELIVERY_LOCK)
DELIVERY_LOG_PATH = Path(layout.DELIVERY_LOG)


def _write_atomic(path: Path, data: dict) -> None:
    write_atomic(path, json.dumps(data, indent=1))  # a kill leaves the old or the new state, never half


class StateError(ValueError):
    """trainer.json or delivery.json is not what their writers write (torn by hand, edited, foreign);
    `miles replay-spool` says so in one line instead of guessing."""


def _read(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise StateError(f"{path} is not valid JSON ({exc}); it was cut short or edited") from None
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise StateError(f"{path} holds a JSON {type(raw).__name__}, not an object")
    return raw


def _spec(path: Path, name: str, raw: Any) -> SinkSpec:
    if not (isinstance(raw, dict) and set(raw) == {"kind", "options"} and isinstance(raw["kind"], str)
            and isinstance(raw["options"], dict)):
        raise StateError(f"{path}: tracker {name!r} has no valid spec ({{\"kind\": ..., \"options\": {{...}}}}), "
                         f"got {raw!r:.200}")
    return SinkSpec(raw["kind"], raw["options"])


def _mapping(path: Path, raw: dict, key: str) -> dict:
    value = raw.get(key) or {}
    if not isinstance(value, dict):
        raise StateError(f"{path}: {key} must be an object, got {value!r:.200}")
    return value


def try_delivery_lock(run_dir: Path) -> IO | None:
    """The run dir's delivery lock (held by whoever writes delivery.json), open and held; None
    when another process holds it. Closing the file releases it."""
    path = Path(run_dir) / DELIVERY_LOCK_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    f = path.open("a")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return f
    except BlockingIOError:
        f.close()
        return None


def process_start(pid: int) -> str | None:
    """The start time of a live process (field 22 of /proc/PID/stat), so a reused pid is not
    mistaken for it; None when the process is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:  # not pathlib: see TrainerFile.read
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


@dataclass
class TrainerFile:
    path: Path
    trackers: dict[str, SinkSpec] = field(default_factory=dict)  # the trackers that are on
    artifacts: list[str] = field(default_factory=list)  # files to upload once the run ends
    trainer: dict[str, Any] | None = None  # {"pid", "start", "session", "open"} of the trainer process
    close: dict[str, Any] | None = None  # {"session", "final", "timeout"} once that trainer closes

    @classmethod
    def load(cls, run_dir: Path) -> "TrainerFile":
        return cls.read(Path(run_dir) / TRAINER_PATH)

    @classmethod
    def read(cls, path: Path) -> "TrainerFile":
        # The delivery process rereads this file at every poll, with the path it keeps: building
        # Paths in that loop (pathlib interns every part) measured as its largest idle CPU cost.
        raw = _read(path)
        artifacts, trainer, close = raw.get("artifacts") or [], raw.get("trainer"), raw.get("close")
        if not (isinstance(artifacts, list) and all(isinstance(a, str) for a in artifacts)):
            raise StateError(f"{path}: artifacts must be a list of paths, got {artifacts!r:.200}")
        for key, value in (("trainer", trainer), ("close", close)):
            if value is not None and not isinstance(value, dict):
                raise StateError(f"{path}: {key} must be an object or null, got {value!r:.200}")
        return cls(path=path, artifacts=artifacts, trainer=trainer, close=close,
                   trackers={n: _spec(path, n, s) for n, s in _mapping(path, raw, "trackers").items()})

    def save(self) -> None:
        _write_atomic(self.path, {"artifacts": self.artifacts, "trainer": self.trainer, "close": self.close,
                                  "trackers": {n: dataclasses.asdict(s) for n, s in self.trackers.items()}})

    def trainer_alive(self) -> bool:
        t = self.trainer
        return t is not None and isinstance(t.get("pid"), int) and process_start(t["pid"]) == t.get("start")

    def claim(self, session: str) -> None:
        """This process is the run's trainer now (its delivery follows it until it closes or dies)."""
        self.trainer = {"pid": os.getpid(), "start": process_start(os.getpid()), "session": session, "open": False}
        self.close = None


@dataclass
class SinkState:
    spec: SinkSpec
    cursor: int = 0  # journal lines delivered
    uploaded: bool = False  # final artifacts stored and the run finished
    session: str | None = None  # the trainer session whose delivery last opened this tracker run


@dataclass
class DeliveryState:
    path: Path
    sinks: dict[str, SinkState] = field(default_factory=dict)

    @classmethod
    def load(cls, run_dir: Path) -> "DeliveryState":
        path = Path(run_dir) / DELIVERY_PATH
        raw = _read(path)
        sinks = {}
        for name, s in _mapping(path, raw, "sinks").items():
            if not isinstance(s, dict):
                raise StateError(f"{path}: tracker {name!r} must be an object, got {s!r:.200}")
            cursor = s.get("cursor")
            if not isinstance(cursor, int) or isinstance(cursor, bool) or cursor < 0:
                raise StateError(f"{path}: {name}'s cursor (journal lines it holds) must be an integer >= 0, "
                                 f"got {cursor!r:.50}")
            uploaded, session = s.get("uploaded", False), s.get("session")
            if not isinstance(uploaded, bool) or not (session is None or isinstance(session, str)):
                raise StateError(f"{path}: {name}'s uploaded must be true/false and its session a string")
            sinks[name] = SinkState(_spec(path, name, s.get("spec")), cursor, uploaded, session)
        return cls(path=path, sinks=sinks)

    def save(self) -> None:
        _write_atomic(self.path, {"sinks": {name: dataclasses.asdict(s) for name, s in self.sinks.items()}})


def is_run_dir(run_dir: Path) -> bool:
    return (Path(run_dir) / TRAINER_PATH).exists() or (Path(run_dir) / DELIVERY_PATH).exists()


def recorded_lines(run_dir: Path) -> int:
    try:
        return len(read_journal(Path(run_dir) / JOURNAL_NAME))
    except (OSError, ValueError) as exc:  # not a regular file, unreadable
        raise StateError(f"cannot read the journal: {exc}") from None


def pending(recorded: int, sinks: dict[str, SinkState]) -> dict[str, int]:
    """Journal lines not yet delivered, per tracker."""
    return {name: recorded - s.cursor for name, s in sinks.items() if s.cursor < recorded}


def log_spooled(run_dir: Path, left: dict[str, int]) -> dict[str, int]:
    """Log each tracker's undelivered lines with how to deliver them; returns `left`."""
    for name, count in left.items():
        log.warning("tracking: %d journal lines for %s are still spooled; deliver them with "
                    "`miles replay-spool %s`", count, name, run_dir)
    return left


def spooled(run_dir: Path, names: list[str], recorded: int) -> dict[str, int]:
    """The lines of a `recorded`-line journal each of `names` still lacks by the delivery state on
    disk, logged."""
    sinks = DeliveryState.load(run_dir).sinks
    return log_spooled(run_dir, pending(recorded, {n: sinks.get(n, SinkState(SinkSpec(n, {}))) for n in names}))
