"""A run's own record of where it stands: the trainer alive or not, its progress in the journal, how it
ended, the tracker delivery (behind or spooled), and the last lines of every log it wrote."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from miles.diagnose.confine import open_regular
from miles.record import layout
from miles.record.journal import read_journal
from miles.tracking.state import DeliveryState, StateError, TrainerFile, pending

TAIL_LINES = 200
TAIL_BYTES = 256 * 1024  # read at most this much of a log's end: a huge log costs no more
ERROR = re.compile(r"Traceback|Error\b|error:|Exception|FAILED|Killed|exit code|failed", re.IGNORECASE)


@dataclass
class RunState:
    trainer_alive: bool
    last_rollout: int | None  # the last rollout in the journal
    num_rollout: int | None
    closed: dict | None  # the trainer's close request (a clean end), None when it never closed
    delivery: dict[str, int] = field(default_factory=dict)  # tracker -> journal lines not delivered
    delivery_error: str = ""
    delivery_pid: int | None = None  # the live delivery process (holds tracking/delivery.lock)
    logs: dict[str, list[str]] = field(default_factory=dict)  # RUN_DIR-relative path -> last lines

    @property
    def starting(self) -> bool:
        """A live trainer with no rollout in the journal yet: starting (never "dead", N22)."""
        return self.trainer_alive and self.last_rollout is None

    @property
    def finished(self) -> bool:
        """Closed cleanly after its last configured rollout."""
        return self.closed is not None and bool(self.num_rollout) and self.last_rollout == self.num_rollout - 1

    def ending(self) -> str:
        """How a run with no live trainer ended, in words. Rollout ids count from 0, so the count of
        rollouts done is the last id + 1 ("after rollout 5 of 6" read as one short of the end)."""
        if self.finished:
            return f"finished: all {self.num_rollout} rollouts (0..{self.last_rollout}), closed cleanly"
        done = "before any rollout" if self.last_rollout is None else \
            f"after rollout {self.last_rollout} ({self.last_rollout + 1} rollouts done" + \
            (f" of {self.num_rollout})" if self.num_rollout else ")")
        if self.closed is None:
            return f"the trainer died {done} without closing (killed or crashed)"
        return f"stopped: closed {done} (a red-flag stop, a chunk's end or an error)"

    @property
    def status(self) -> str:
        """A run without a live trainer: "finished", "stopped" (a clean close before its end) or "dead"."""
        return "finished" if self.finished else ("stopped" if self.closed is not None else "dead")

    def error_lines(self, limit: int = 5) -> list[str]:
        """The last lines that read like an error, across the logs (`path: line`)."""
        found = [f"{path}: {line.strip()}" for path, lines in self.logs.items() for line in lines if ERROR.search(line)]
        return found[-limit:]


def tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last lines of a regular file (none of a FIFO or a folder: reading one could block)."""
    f = open_regular(path)
    if f is None:
        return []
    try:
        with f:
            f.seek(max(os.fstat(f.fileno()).st_size - TAIL_BYTES, 0))
            data = f.read()
    except OSError:
        return []
    return data.decode(errors="replace").splitlines()[-lines:]


def log_files(run_dir: Path) -> list[Path]:
    """Every log the run wrote: RUN_DIR/logs/*, the delivery log, the health log."""
    from miles.diagnose.confine import inside

    run = layout.RunLayout(run_dir)
    # a link could point out of the run dir (a hostile one), the file's or a folder's above it (tracking/):
    # only the run's own regular files
    found = sorted(p for p in run.logs.glob("*") if p.is_file() and not p.is_symlink()) \
        if run.logs.is_dir() and not run.logs.is_symlink() else []
    return [p for p in found + [run.delivery_log, run.health]
            if p.is_file() and not p.is_symlink() and inside(run_dir, p)]


def configured_rollouts(run_dir: Path) -> int | None:
    try:
        params = yaml.safe_load(layout.RunLayout(run_dir).tracking_config.read_text())
        value = params.get("num_rollout") if isinstance(params, dict) else None
        return value if isinstance(value, int) else None
    except (OSError, yaml.YAMLError):
        return None


def read_run_state(run_dir: Path, trainer_alive: bool, logs_from: Path | None = None) -> RunState:
    """The run's state from `run_dir` (a confined copy of its files, see `confine`), its logs from
    `logs_from` (default the same folder)."""
    run_dir = Path(run_dir)
    try:
        journal = read_journal(layout.RunLayout(run_dir).journal)
    except (OSError, ValueError):
        journal = []
    last = max((ln.rollout_id for ln in journal), default=None)
    state = RunState(trainer_alive, last, configured_rollouts(run_dir), None)
    try:
        state.closed = TrainerFile.load(run_dir).close
        sinks = DeliveryState.load(run_dir).sinks
        state.delivery = {name: count for name, count in pending(len(journal), sinks).items()}
    except (StateError, OSError, ValueError) as exc:
        state.delivery_error = str(exc)[:300]
    logs_root = Path(logs_from) if logs_from is not None else run_dir
    state.logs = {str(p.relative_to(logs_root)): tail(p) for p in log_files(logs_root)}
    return state
