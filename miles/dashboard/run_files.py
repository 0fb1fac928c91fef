"""Read a run directory for the dashboard: only whole lines, never a write, missing files named.

Every file is opened read-only. A JSON-lines file is read up to its last newline, so a
line another process is still appending is left for the next read; lines that do not
parse are counted, not fatal. Reads are cached per file by (size, mtime), so following a
live run rereads only what changed.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from miles.record import layout

# what the dashboard reads (miles.record.layout names every file of RUN_DIR)
JOURNAL_NAME, TIMELINE_NAME, SAMPLES_DIR, TOKENS_DIR = layout.JOURNAL, layout.TIMELINE, layout.SAMPLES, layout.TOKENS
CONFIG_ARTIFACT = Path(layout.TRACKING_CONFIG)
HEALTH_NAME = layout.HEALTH  # the health watch's verdicts: {rollout_id, signal, severity, message, values}
PROFILER_SUMMARIES = Path(layout.PROFILER_SUMMARIES)  # {target, rank, start, end, trace, top_ops, spans}
BASE_EVAL = layout.BASE_EVAL


@dataclass
class Lines:
    """A JSON-lines file as read now."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    present: bool = False
    skipped: int = 0  # lines that did not parse (corrupt or not objects)

    def describe(self) -> dict[str, Any]:
        return {"present": self.present, "lines": len(self.rows), "skipped": self.skipped}


def parse_lines(data: bytes) -> Lines:
    out = Lines(present=True)
    for raw in data[: data.rfind(b"\n") + 1].splitlines():
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            out.skipped += 1
            continue
        if isinstance(row, dict):
            out.rows.append(row)
        else:
            out.skipped += 1
    return out


class RunFiles:
    """The files of one run directory, read on demand."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self._cache: dict[Path, tuple[tuple[int, int], Any]] = {}
        self._lock = threading.Lock()

    def _cached(self, path: Path, parse) -> Any:
        try:
            st = os.stat(path)
        except OSError:
            return None
        key = (st.st_size, st.st_mtime_ns)
        with self._lock:
            hit = self._cache.get(path)
        if hit and hit[0] == key:
            return hit[1]
        with open(path, "rb") as f:  # read-only, whatever the caller does
            value = parse(f.read())
        with self._lock:
            self._cache[path] = (key, value)
        return value

    def lines(self, relative: Path | str) -> Lines:
        return self._cached(self.run_dir / relative, parse_lines) or Lines()

    def journal(self) -> Lines:
        return self.lines(JOURNAL_NAME)

    def timeline(self) -> Lines:
        return self.lines(TIMELINE_NAME)

    def health(self) -> Lines:
        return self.lines(HEALTH_NAME)

    def profiler(self) -> Lines:
        return self.lines(PROFILER_SUMMARIES)

    def config(self) -> dict[str, Any]:
        """The run's redacted flat config (empty when missing or unreadable)."""
        def parse(data: bytes) -> dict[str, Any]:
            try:
                loaded = yaml.safe_load(data)
            except yaml.YAMLError:
                return {}
            return loaded if isinstance(loaded, dict) else {}
        return self._cached(self.run_dir / CONFIG_ARTIFACT, parse) or {}

    def base_eval(self) -> dict[str, Any]:
        def parse(data: bytes) -> dict[str, Any]:
            try:
                loaded = json.loads(data)
            except ValueError:
                return {}
            return loaded if isinstance(loaded, dict) else {}
        return self._cached(self.run_dir / BASE_EVAL, parse) or {}

    def sample_rollouts(self) -> list[int]:
        """Rollout ids that have a sample table."""
        return _rollout_ids(self.run_dir / SAMPLES_DIR)

    def token_rollouts(self) -> list[int]:
        return _rollout_ids(self.run_dir / TOKENS_DIR)

    def samples(self, rollout_id: int) -> Lines:
        return self.lines(Path(SAMPLES_DIR) / f"rollout_{rollout_id:06d}.jsonl")

    def tokens(self, rollout_id: int) -> Lines:
        return self.lines(Path(TOKENS_DIR) / f"rollout_{rollout_id:06d}.jsonl")

    def status(self) -> dict[str, dict[str, Any]]:
        """What is there and what is missing, per source the dashboard reads."""
        files = {"journal": self.journal(), "timeline": self.timeline(), "health": self.health(),
                 "profiler": self.profiler()}
        out = {name: {"path": str(_relative(name)), **lines.describe()} for name, lines in files.items()}
        out["samples"] = {"path": SAMPLES_DIR + "/", "present": bool(self.sample_rollouts()),
                          "rollouts": len(self.sample_rollouts())}
        out["tokens"] = {"path": TOKENS_DIR + "/", "present": bool(self.token_rollouts()),
                         "rollouts": len(self.token_rollouts())}
        out["config"] = {"path": str(CONFIG_ARTIFACT), "present": bool(self.config())}
        return out


def _relative(name: str) -> Path:
    return {"journal": Path(JOURNAL_NAME), "timeline": Path(TIMELINE_NAME), "health": Path(HEALTH_NAME),
            "profiler": PROFILER_SUMMARIES}[name]


def _rollout_ids(directory: Path) -> list[int]:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    ids = []
    for name in names:
        if name.startswith("rollout_") and name.endswith(".jsonl"):
            try:
                ids.append(int(name[len("rollout_"):-len(".jsonl")]))
            except ValueError:
                continue
    return sorted(ids)
