"""The run journal `RUN_DIR/metrics.jsonl`: one JSON line per recorded iteration, the
source of truth every tracker must equal.

A line is flat: `rollout_id` (the iteration) and `time` (unix seconds, when recorded; the
trackers reuse it as the point's timestamp, so re-delivering a line is recognisably the
same point) plus the mapped metric keys, step counters included. The eval of the starting
weights, before any training, is a line of its own with rollout id -1 and `eval/step` 0.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

JOURNAL_NAME = "metrics.jsonl"
BOOKKEEPING = ("rollout_id", "time")
BASE_EVAL_ROLLOUT_ID = -1  # the line of the eval before training: it sorts before rollout 0


@dataclass(frozen=True)
class JournalLine:
    rollout_id: int
    time: float
    metrics: dict[str, float]

    def to_json(self) -> str:
        return json.dumps({"rollout_id": self.rollout_id, "time": self.time, **self.metrics})

    @classmethod
    def from_json(cls, text: str) -> "JournalLine":
        raw = json.loads(text)
        return cls(rollout_id=int(raw.pop("rollout_id")), time=float(raw.pop("time")), metrics=raw)


def read_journal(path: Path) -> list[JournalLine]:
    """Every complete line of a journal (a torn last line from a killed writer is skipped)."""
    if not path.exists():
        return []
    lines = []
    for text in path.read_text().splitlines():
        try:
            lines.append(JournalLine.from_json(text))
        except (json.JSONDecodeError, KeyError):
            continue
    return lines


class Journal:
    """Append-only on disk and in memory; cut back only past a checkpoint on resume."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / JOURNAL_NAME
        self.lines = read_journal(self.path)

    def append(self, line: JournalLine) -> None:
        with self.path.open("a") as f:
            f.write(line.to_json() + "\n")
        self.lines.append(line)

    def truncate_after(self, rollout_id: int | None) -> None:
        """Drop lines of rollouts after `rollout_id` (all lines for None): they will be redone."""
        self.lines = [ln for ln in self.lines if rollout_id is not None and ln.rollout_id <= rollout_id]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(ln.to_json() + "\n" for ln in self.lines))
        tmp.replace(self.path)

    def count_through(self, rollout_id: int) -> int:
        """How many leading lines belong to rollouts up to `rollout_id` (lines are in rollout order)."""
        n = 0
        for ln in self.lines:
            if ln.rollout_id > rollout_id:
                break
            n += 1
        return n


class JournalFollower:
    """The delivery side's view of a journal another process appends to: committed lines,
    read from disk as they are committed.

    Lines up to the committed count never change (a redo of an uncommitted rollout rewrites
    only lines past it, byte for byte the same before), so the follower keeps only lines it
    was asked for and the byte offset after them, and reads on from there by path (the file
    may have been replaced meanwhile). Lines past the asked count are never cached: they may
    still be redone."""

    def __init__(self, path: Path):
        self.path = path
        self.lines: list[JournalLine] = []
        self._offset = 0

    def read_through(self, count: int) -> list[JournalLine]:
        """The first `count` lines, or as many complete lines as the file holds when fewer."""
        if len(self.lines) < count and self.path.exists():
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
            pos = 0
            while len(self.lines) < count:
                end = data.find(b"\n", pos)
                if end < 0:
                    break  # a line still being written
                try:
                    self.lines.append(JournalLine.from_json(data[pos:end].decode()))
                except (json.JSONDecodeError, KeyError, UnicodeDecodeError):
                    pass  # a torn line a killed writer left (read_journal skips it too)
                pos = end + 1
            self._offset += pos
        return self.lines[:count]
