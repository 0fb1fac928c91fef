"""The run journal `RUN_DIR/metrics.jsonl`: one JSON line per recorded iteration, the
source of truth every tracker must equal.

A line is flat: `rollout_id` (the iteration) and `time` (unix seconds, when recorded; the
trackers reuse it as the point's timestamp, so re-delivering a line is recognisably the
same point) plus the mapped metric keys, step counters included. The eval of the starting
weights, before any training, is a line of its own with rollout id -1 and `eval/step` 0.
Lines are never rewritten, so a line's index is a stable identity (wandb's step).

The journal is strict JSON (no bare NaN or Infinity, which most JSON readers refuse): a metric
that is not finite (an overflowed eval mean, a NaN loss) is written as `null` and its name listed
under `non_finite`. Every reader takes it the same way: no point for that metric (trackers,
dashboard series), and the name flagged (the health watch's `non_finite` signal, `miles doctor`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from miles.record import layout
from miles.record.names import map_metrics, metric_key

JOURNAL_NAME = layout.JOURNAL
REDONE_PATH = Path(layout.REDONE)  # lines of rollouts redone after a crash (see Journal)
NON_FINITE = "non_finite"  # the line's key listing its metrics that were not finite (written as null)
BOOKKEEPING = ("rollout_id", "time", NON_FINITE)
BASE_EVAL_ROLLOUT_ID = -1  # the line of the eval before training: it sorts before rollout 0


@dataclass(frozen=True)
class JournalLine:
    rollout_id: int
    time: float
    metrics: dict[str, float]  # finite values only (see non_finite)
    non_finite: tuple[str, ...] = ()  # metrics recorded without a value: they were NaN or infinite

    def __post_init__(self):
        bad = {k for k, v in self.metrics.items() if isinstance(v, float) and not math.isfinite(v)}
        if bad:
            object.__setattr__(self, "metrics", {k: v for k, v in self.metrics.items() if k not in bad})
        names = tuple(sorted(bad | set(self.non_finite)))
        object.__setattr__(self, "non_finite", names)

    def to_json(self) -> str:
        extra = {**{k: None for k in self.non_finite}, NON_FINITE: list(self.non_finite)} if self.non_finite else {}
        return json.dumps({"rollout_id": self.rollout_id, "time": self.time, **self.metrics, **extra},
                          allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> "JournalLine":
        """One line, or BadLine: a line that is not an object with an integer `rollout_id` and a finite
        `time`. Metric values that are not numbers (a hand-edited or foreign line) are dropped, so that
        one of them cannot stop a tracker that must take numbers; names under `non_finite`, and bare NaN or
        Infinity values of a journal written before it was strict, become `non_finite`."""
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError) as exc:  # ValueError covers JSONDecodeError and UnicodeDecodeError
            raise BadLine(f"not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise BadLine(f"a JSON {type(raw).__name__}, not an object")
        rollout_id, time = raw.pop("rollout_id", None), raw.pop("time", None)
        if isinstance(rollout_id, float) and rollout_id.is_integer():
            rollout_id = int(rollout_id)
        if not isinstance(rollout_id, int) or isinstance(rollout_id, bool) or abs(rollout_id) > 2**53:
            raise BadLine(f"rollout_id is {rollout_id!r:.50}, not an integer")
        if not isinstance(time, (int, float)) or isinstance(time, bool) or not math.isfinite(float(time)):
            raise BadLine(f"time is {time!r:.50}, not a finite number")
        listed = raw.pop(NON_FINITE, None)
        non_finite = tuple(n for n in listed if isinstance(n, str)) if isinstance(listed, list) else ()
        metrics = {k: v for k, v in raw.items() if _is_number(v)}
        return cls(rollout_id=rollout_id, time=float(time), metrics=metrics, non_finite=non_finite)


def strict_json(metrics: dict[str, float], indent: int | None = 2) -> str:
    """A metrics dict as strict JSON, the journal's way: non-finite values null, their names under `non_finite`
    (for RUN_DIR/base_eval.json, which holds the same eval metrics as the journal's base-eval line)."""
    line = JournalLine(0, 0.0, dict(metrics))
    extra = {**{k: None for k in line.non_finite}, NON_FINITE: list(line.non_finite)} if line.non_finite else {}
    return json.dumps({**line.metrics, **extra}, indent=indent, allow_nan=False)


def base_eval_json(metrics: dict[str, float]) -> str:
    """RUN_DIR/base_eval.json's text: the base eval's metrics under the journal's (tracker-safe) names,
    `eval/arithmetic-pass_at_1` rather than the evaluator's `eval/arithmetic-pass@1`."""
    return strict_json(map_metrics(metrics))


def base_eval_names(raw: dict) -> dict:
    """A base_eval.json read back under the journal's names (files written before they were mapped hold
    `pass@k`)."""
    return {metric_key(k): v for k, v in raw.items()}


class BadLine(ValueError):
    """A journal line that cannot be read as one (skipped by every reader alike, so line indices agree)."""


def _is_number(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, float) or abs(value) < 2**1023  # an int too large for a float is no metric


def count_rollouts(run_dir: Path) -> int:
    """Iterations in the run's journal (cheap: no line is parsed; the base eval's line is not one)."""
    path = Path(run_dir) / JOURNAL_NAME
    if not path.exists():
        return 0
    with path.open("rb") as f:
        return sum(1 for line in f if not line.startswith(b'{"rollout_id": -1'))


class UnreadableRun(Exception):
    """A run (or a trusted-run record) whose files cannot be read as a run's: `miles doctor` and
    `miles compare` exit 3, not 1 (a red flag is a finding about a run, this is none)."""


def read_journal(path: Path) -> list[JournalLine]:
    """Every complete line of a journal (a torn last line from a killed writer, and any other line that
    is not a journal line, is skipped). `path` must be a regular file when it exists (ValueError else:
    opening a FIFO would block)."""
    if not path.exists():
        return []
    if not path.is_file():
        raise ValueError(f"{path} is not a regular file")
    lines = []
    for text in path.read_bytes().splitlines():
        try:
            lines.append(JournalLine.from_json(text))
        except BadLine:
            continue
    return lines


class Journal:
    """Append-only, on disk and in memory: a rollout's line is written once, by the first run of
    it. A rollout redone after a crash (trained again from an older checkpoint) keeps that line;
    the redo's own metrics go to `tracking/redone.jsonl`, so every tracker, which may already
    show the first line, and the journal stay equal."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / JOURNAL_NAME
        self.redone_path = run_dir / REDONE_PATH
        self._repair()
        self.lines = read_journal(self.path)
        self.recorded = {ln.rollout_id for ln in self.lines}

    def _repair(self) -> None:
        """Cut a torn last line (a writer killed mid-line) so that the next line starts clean."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with self.path.open("r+b") as f:
            f.seek(-1, 2)
            if f.read(1) != b"\n":
                f.seek(0)
                f.truncate(f.read().rfind(b"\n") + 1)

    def append(self, line: JournalLine) -> bool:
        """Write the line; False (written to the redone file instead) when its rollout has one."""
        first = line.rollout_id not in self.recorded
        path = self.path if first else self.redone_path
        if not first:
            path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(line.to_json() + "\n")
        if first:
            self.lines.append(line)
            self.recorded.add(line.rollout_id)
        return first


class JournalFollower:
    """The delivery side's view of a journal another process appends to: its complete lines,
    read on from the byte offset after the last one (a line being written is left for later)."""

    def __init__(self, path: Path):
        self.path = path
        self.lines: list[JournalLine] = []
        self._offset = 0

    def read(self) -> list[JournalLine]:
        if self.path.exists() and self.path.stat().st_size > self._offset:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
            end = data.rfind(b"\n") + 1
            for text in data[:end].splitlines():
                try:
                    self.lines.append(JournalLine.from_json(text))
                except BadLine:
                    pass  # a torn line a killed writer left, or another non-line (read_journal skips it too)
            self._offset += end
        return self.lines
