"""The sample table wandb and MLflow show is bounded: rows, text and log-probs per row."""
from __future__ import annotations

import json

from miles.record.sample_table import COLUMNS, MAX_CHARS, MAX_LOG_PROBS, sample_table


def test_the_table_is_bounded(tmp_path):
    path = tmp_path / "rollout_000000.jsonl"
    rows = [{"rollout_id": 0, "index": i, "group_index": i // 4, "prompt": "p" * (MAX_CHARS * 3), "response": "r",
             "reward": 1.0, "rollout_log_probs": [-0.1] * (MAX_LOG_PROBS * 4)} for i in range(200)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    columns, table = sample_table(path, max_rows=10)
    assert columns == COLUMNS and len(table) == 10
    cell = dict(zip(columns, table[0]))
    assert len(cell["prompt"]) < MAX_CHARS + 50 and cell["prompt"].endswith(f"[{MAX_CHARS * 2} more characters]")
    assert json.loads(cell["log_probs"]) == [-0.1] * MAX_LOG_PROBS
    assert abs(cell["log_prob_mean"] + 0.1) < 1e-12 and cell["response"] == "r"
    assert len(json.dumps(table)) < 10 * (MAX_CHARS + 1000)  # a few KB per row, however long the rollout's
