"""The tracking state of a run directory, in two files with one writer each:

- `RUN_DIR/tracking/committed.json`, written only by the training process: how many journal
  lines a checkpoint covers (`committed`), the trackers the run has on (`trackers`, their specs
  as first asked for: a delivery process that died before writing anything leaves these for
  `miles replay-spool`) and at the end the files to upload (`artifacts`);
- `RUN_DIR/tracking/delivery.json`, written only by the delivery process (or `miles
  replay-spool`) holding `RUN_DIR/tracking/delivery.lock`: per tracker how to rebuild it
  (its spec, run id included), how many journal lines it holds (`cursor`) and whether its
  run is finished with the artifacts stored (`uploaded`).

`TrackingState.load` is the read-only view of both, what `resume`, `miles replay-spool` and
the tests start from. A tracker's spool is the journal past its cursor: committed lines are
already on disk there, so an outage spools nothing twice and loses nothing when a process ends.
A run directory of the earlier single-file layout (`tracking/state.json`) is read as well.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from miles.tracking.sinks.base import SinkSpec

CONFIG_ARTIFACT = Path("tracking") / "config.yaml"  # the public (redacted) config: tracker params, an artifact
COMMITTED_PATH = Path("tracking") / "committed.json"
DELIVERY_PATH = Path("tracking") / "delivery.json"
DELIVERY_LOCK_PATH = Path("tracking") / "delivery.lock"
LEGACY_STATE_PATH = Path("tracking") / "state.json"  # read only: run dirs of the single-file layout


def _write_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)  # atomic: a kill leaves the old or the new state, never half


def _legacy(run_dir: Path) -> dict | None:
    path = Path(run_dir) / LEGACY_STATE_PATH
    return json.loads(path.read_text()) if path.exists() else None


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


@dataclass
class SinkState:
    spec: SinkSpec
    cursor: int = 0  # journal lines delivered
    uploaded: bool = False  # final artifacts stored and the run finished


@dataclass
class CommitState:
    """The training process's file."""

    path: Path
    committed: int = 0  # journal lines covered by a checkpoint
    trackers: dict[str, SinkSpec] = field(default_factory=dict)  # the trackers that are on
    artifacts: list[str] = field(default_factory=list)  # files to upload once the run ends

    @classmethod
    def load(cls, run_dir: Path) -> "CommitState":
        path = Path(run_dir) / COMMITTED_PATH
        raw = json.loads(path.read_text()) if path.exists() else _legacy(run_dir) or {}
        return cls(path=path, committed=raw.get("committed", 0), artifacts=raw.get("artifacts", []),
                   trackers={name: SinkSpec(**spec) for name, spec in raw.get("trackers", {}).items()})

    def save(self) -> None:
        _write_atomic(self.path, {"committed": self.committed, "artifacts": self.artifacts,
                                  "trackers": {name: dataclasses.asdict(s) for name, s in self.trackers.items()}})


@dataclass
class DeliveryState:
    """The delivery process's file."""

    path: Path
    sinks: dict[str, SinkState] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def load(cls, run_dir: Path) -> "DeliveryState":
        path = Path(run_dir) / DELIVERY_PATH
        raw = json.loads(path.read_text()) if path.exists() else _legacy(run_dir) or {}
        sinks = {name: SinkState(SinkSpec(**s["spec"]), s["cursor"], s.get("uploaded", False))
                 for name, s in raw.get("sinks", {}).items()}
        return cls(path=path, sinks=sinks)

    def save(self) -> None:
        with self._lock:
            _write_atomic(self.path, {"sinks": {name: {"spec": dataclasses.asdict(s.spec), "cursor": s.cursor,
                                                       "uploaded": s.uploaded}
                                                for name, s in self.sinks.items()}})


@dataclass(frozen=True)
class TrackingState:
    """Both files of a run directory, read at one moment (never written through this view)."""

    run_dir: Path
    committed: int
    sinks: dict[str, SinkState]
    artifacts: list[str]

    @classmethod
    def load(cls, run_dir: Path) -> "TrackingState":
        commits, delivery = CommitState.load(run_dir), DeliveryState.load(run_dir)
        return cls(Path(run_dir), commits.committed, delivery.sinks, commits.artifacts)

    def exists(self) -> bool:
        return any((self.run_dir / p).exists() for p in (COMMITTED_PATH, DELIVERY_PATH, LEGACY_STATE_PATH))

    def pending(self) -> dict[str, int]:
        """Committed lines not yet delivered, per tracker."""
        return pending(self.committed, self.sinks)


def pending(committed: int, sinks: dict[str, SinkState]) -> dict[str, int]:
    return {name: committed - s.cursor for name, s in sinks.items() if s.cursor < committed}
