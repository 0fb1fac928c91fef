"""`RUN_DIR/tracking/state.json`: how far the journal is committed, and per tracker how far
it is delivered and how to rebuild it; what `resume` and `miles replay-spool` start from.

A tracker's spool is the journal past its cursor: committed lines are already on disk
there, so an outage spools nothing twice and loses nothing when the process ends.
"""
from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

from miles.tracking.sinks.base import SinkSpec

STATE_PATH = Path("tracking") / "state.json"


@dataclass
class SinkState:
    spec: SinkSpec
    cursor: int = 0  # journal lines delivered
    uploaded: bool = False  # final artifacts stored and the run finished


@dataclass
class TrackingState:
    path: Path
    committed: int = 0  # journal lines covered by a checkpoint
    sinks: dict[str, SinkState] = field(default_factory=dict)
    artifacts: list[str] = field(default_factory=list)  # files to upload once the run ends
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def load(cls, run_dir: Path) -> "TrackingState":
        path = Path(run_dir) / STATE_PATH
        if not path.exists():
            return cls(path=path)
        raw = json.loads(path.read_text())
        sinks = {name: SinkState(SinkSpec(**s["spec"]), s["cursor"], s.get("uploaded", False))
                 for name, s in raw.get("sinks", {}).items()}
        return cls(path=path, committed=raw["committed"], sinks=sinks, artifacts=raw.get("artifacts", []))

    def save(self) -> None:
        with self._lock:
            data = {"committed": self.committed, "artifacts": self.artifacts,
                    "sinks": {name: {"spec": dataclasses.asdict(s.spec), "cursor": s.cursor, "uploaded": s.uploaded}
                              for name, s in self.sinks.items()}}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1))
            tmp.replace(self.path)  # atomic: a kill leaves the old or the new state, never half

    def pending(self) -> dict[str, int]:
        """Committed lines not yet delivered, per tracker."""
        return {name: self.committed - s.cursor for name, s in self.sinks.items() if s.cursor < self.committed}
