"""What a journal reader skipped, named: the lines that are not journal lines and the values that are not
numbers. Every reader skips them alike (`miles.record.journal`), so a verdict may rest on fewer points
than the file seems to hold; `miles doctor` names them rather than exit 0 in silence (issue 38)."""
from __future__ import annotations

import json
from pathlib import Path

from miles.record.journal import BOOKKEEPING, BadLine, JournalLine

MAX_NAMED = 5  # problems named one by one; the rest counted
# shares of a rollout's samples or groups: a value outside [0, 1] is no share, and no verdict rests on it
SHARES = frozenset({"rollout/aborted_ratio", "rollout/degenerate_group_ratio", "rollout/truncated_ratio"})


def _kind(value) -> str:
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, int):
        return f"an integer of {len(str(abs(value)))} digits, past the float range"
    return f"a JSON {type(value).__name__}".replace("dict", "object").replace("str", "string")


def journal_problems(path: Path) -> list[str]:
    """One line per problem, first ones first: `line N: <key> is <kind>, not a number (dropped)` or `line N:
    skipped: <why>`; a torn last line (a writer killed mid-line, or one still writing) is none."""
    data = Path(path).read_bytes() if Path(path).is_file() else b""
    complete = data[: data.rfind(b"\n") + 1]
    problems: list[str] = []
    for number, text in enumerate(complete.splitlines(), 1):
        if not text.strip():
            continue
        try:
            line = JournalLine.from_json(text)
        except BadLine as exc:
            problems.append(f"line {number}: skipped: {' '.join(str(exc).split())[:120]}")
            continue
        raw = json.loads(text)
        kept = set(line.metrics) | set(line.non_finite) | set(BOOKKEEPING)
        for key, value in raw.items():
            if key not in kept and value is not None:
                problems.append(f"line {number} (rollout {line.rollout_id}): {key[:80]!r} is {_kind(value)}, "
                                f"not a number (dropped)")
            elif key in SHARES and key in line.metrics and not 0.0 <= line.metrics[key] <= 1.0:
                problems.append(f"line {number} (rollout {line.rollout_id}): {key!r} is {line.metrics[key]:g}, "
                                f"outside [0, 1] for a share (dropped)")
    if len(problems) > MAX_NAMED:
        problems = problems[:MAX_NAMED] + [f"... and {len(problems) - MAX_NAMED} more"]
    return problems
