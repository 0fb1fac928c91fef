"""The bounded table of one rollout's samples that wandb (a Table) and MLflow (a table artifact) show:
prompt, response, reward, advantage and the engine's log-probs per sample, read from the samples file.

Bounded so a large rollout cannot bloat a tracker: at most MAX_ROWS samples (whole groups first, in
rollout order), each text cut to MAX_CHARS characters and each log-prob list to MAX_LOG_PROBS values;
the samples file in the run dir keeps everything. Every cell is valid UTF-8 text (a lone surrogate in a
sample made MLflow's table fail: probe ST1), and a line that does not parse is left out, not fatal.
"""
from __future__ import annotations

import json
from pathlib import Path

from miles.record.unicode_text import valid_text

MAX_ROWS = 64
MAX_CHARS = 2000
MAX_LOG_PROBS = 64

COLUMNS = ["rollout_id", "index", "group_index", "prompt", "response", "label", "reward", "raw_reward", "advantage",
           "response_length", "status", "num_turns", "log_prob_mean", "log_probs", "conversation"]


def _cut(text, limit: int = MAX_CHARS):
    if not isinstance(text, str):
        return text
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more characters]"


def _list(value) -> list:
    return value if isinstance(value, list) else []


def table_row(row: dict) -> list:
    """One sample's cells, in COLUMNS order."""
    log_probs = [lp for lp in _list(row.get("rollout_log_probs")) if isinstance(lp, (int, float))]
    conversation = "\n".join(f"{m.get('role')}: {m.get('content')}" for m in _list(row.get("messages"))
                             if isinstance(m, dict))
    cells = dict(row, log_prob_mean=sum(log_probs) / len(log_probs) if log_probs else None,
                 log_probs=json.dumps([round(lp, 4) for lp in log_probs[:MAX_LOG_PROBS]]), conversation=conversation)
    return [_cut(valid_text(cells.get(c))) for c in COLUMNS]


def sample_table(path: Path, max_rows: int = MAX_ROWS) -> tuple[list[str], list[list]]:
    """(columns, rows) of the samples file at `path`, at most `max_rows` rows."""
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if len(rows) >= max_rows:
                break
            try:
                row = json.loads(line) if line.strip() else None
            except (ValueError, RecursionError):  # a torn or hand-edited line: the table shows the others
                continue
            if isinstance(row, dict):
                rows.append(table_row(row))
    return list(COLUMNS), rows
