"""Read a run directory for the dashboard: only whole lines, never a write, missing files named.

Every file is opened read-only. A JSON-lines file is read up to its last newline, so a
line another process is still appending is left for the next read; lines that do not
parse are counted, not fatal. Reads are cached per file by (size, mtime), so following a
live run rereads only what changed.
"""
from __future__ import annotations

import json
import math
import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from miles.record import layout
from miles.record.journal import NON_FINITE, base_eval_names
from miles.record.unicode_text import may_hold_surrogate, valid_text

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


def parse_lines(data: bytes, check=None) -> Lines:
    """The object lines of a JSON-lines file; `check(row)` returns the row to keep (possibly cleaned)
    or None for a row of the wrong shape, counted as skipped like one that does not parse."""
    out = Lines(present=True)
    for raw in data[: data.rfind(b"\n") + 1].splitlines():
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except (ValueError, RecursionError):  # ValueError covers UnicodeDecodeError
            out.skipped += 1
            continue
        if may_hold_surrogate(raw):  # a lone "\ud800" made the answer unencodable: a 500 (probe ST4)
            row = valid_text(row)
        kept = row if isinstance(row, dict) and check is None else (check(row) if isinstance(row, dict) else None)
        if kept is None:
            out.skipped += 1
        else:
            out.rows.append(kept)
    return out


# Shapes the views rely on, per file (the writers always produce them; a hand-edited or foreign line
# may not). A value of the wrong type in a field the views compute with skips the line.
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_finite(value: Any) -> bool:
    """A number a view can compute with: finite, and (an int) within float range: a 401-digit integer
    made math.isfinite raise OverflowError, a 500 on every view (probe A5)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) < 2**1023
    return _is_number(value) and math.isfinite(value)


MAX_SPAN_TIME = 1e12  # unix seconds (year 33658): a span time past it is no time (1e308 * 1e6 overflows)


def journal_row(row: dict) -> dict | None:
    """A journal line: an integer rollout id; values that are not numbers are left out (a non-finite
    metric's null among them), the names listed under `non_finite` kept as a list of strings."""
    if not _is_int(row.get("rollout_id")):
        return None
    out = {k: v for k, v in row.items() if k == "rollout_id" or _is_finite(v)}
    listed = row.get(NON_FINITE)
    bad = {k for k, v in row.items() if _is_number(v) and not _is_finite(v)}  # a journal from before it was strict
    names = sorted(bad | {n for n in listed if isinstance(n, str)} if isinstance(listed, list) else bad)
    if names:
        out[NON_FINITE] = names
    return out


def timeline_row(row: dict) -> dict | None:
    """A span: finite start and end, a rollout id that is an integer or absent."""
    rollout_id = row.get("rollout_id")
    times = (row.get("start"), row.get("end"))
    if not all(_is_finite(t) and abs(t) <= MAX_SPAN_TIME for t in times):
        return None
    if not (rollout_id is None or _is_int(rollout_id)):
        return None
    return row


def health_row(row: dict) -> dict | None:
    """A verdict: a rollout id that is an integer or absent."""
    rollout_id = row.get("rollout_id")
    return row if rollout_id is None or _is_int(rollout_id) else None


def sample_row(row: dict) -> dict | None:
    """A sample: group and index integers (or absent), reward a number or null, length an integer or
    absent; prompt and response shown as text whatever they hold (null: empty)."""
    if not all(row.get(k) is None or _is_int(row[k]) for k in ("group_index", "index", "response_length")):
        return None
    if not all(row.get(k) is None or _is_number(row[k]) for k in ("reward", "raw_reward")):
        return None
    for key in ("prompt", "response"):
        value = row.get(key)
        if not isinstance(value, str):
            row = {**row, key: "" if value is None else json.dumps(value)}
    return row


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
        if not stat.S_ISREG(st.st_mode):
            return None  # a directory or a FIFO where a file should be: missing (opening a FIFO would block)
        key = (st.st_size, st.st_mtime_ns)
        with self._lock:
            hit = self._cache.get(path)
        if hit and hit[0] == key:
            return hit[1]
        try:
            with open(path, "rb") as f:  # read-only, whatever the caller does
                value = parse(f.read())
        except OSError:  # unreadable (permissions), or gone since the stat
            return None
        with self._lock:
            self._cache[path] = (key, value)
        return value

    def lines(self, relative: Path | str, check=None) -> Lines:
        return self._cached(self.run_dir / relative, lambda data: parse_lines(data, check)) or Lines()

    def journal(self) -> Lines:
        return self.lines(JOURNAL_NAME, journal_row)

    def timeline(self) -> Lines:
        return self.lines(TIMELINE_NAME, timeline_row)

    def health(self) -> Lines:
        return self.lines(HEALTH_NAME, health_row)

    def profiler(self) -> Lines:
        return self.lines(PROFILER_SUMMARIES)

    def config(self) -> dict[str, Any]:
        """The run's redacted flat config (empty when missing or unreadable)."""
        def parse(data: bytes) -> dict[str, Any]:
            try:
                loaded = yaml.safe_load(data)
            except (yaml.YAMLError, RecursionError):
                return {}
            return valid_text(loaded) if isinstance(loaded, dict) else {}
        return self._cached(self.run_dir / CONFIG_ARTIFACT, parse) or {}

    def base_eval(self) -> dict[str, Any]:
        def parse(data: bytes) -> dict[str, Any]:
            try:
                loaded = json.loads(data)
            except (ValueError, RecursionError):
                return {}
            return base_eval_names(valid_text(loaded)) if isinstance(loaded, dict) else {}
        return self._cached(self.run_dir / BASE_EVAL, parse) or {}

    def sample_rollouts(self) -> list[int]:
        """Rollout ids that have a sample table."""
        return _rollout_ids(self.run_dir / SAMPLES_DIR)

    def token_rollouts(self) -> list[int]:
        return _rollout_ids(self.run_dir / TOKENS_DIR)

    def samples(self, rollout_id: int) -> Lines:
        return self.lines(Path(SAMPLES_DIR) / f"rollout_{rollout_id:06d}.jsonl", sample_row)

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
