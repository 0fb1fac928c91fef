"""Issue 38: `miles doctor` on a journal with odd-typed values exited 0 in silence, its verdicts resting on
fewer points than the file holds. Every reader still skips them alike; the doctor names each one (the line,
the rollout, the key and what it holds), so a user knows which values no verdict saw."""
from __future__ import annotations

from miles.health.cli import main as doctor

GOOD = '{"rollout_id": 0, "time": 1.0, "train/loss": 0.5}'


def test_odd_typed_values_and_skipped_lines_are_named(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text(
        GOOD + "\n"
        + '{"rollout_id": 1, "time": 2.0, "train/loss": "high", "train/grad_norm": [1], "rollout/raw_reward": true}\n'
        + '{"rollout_id": 2, "time": 3.0, "train/loss": 1' + "0" * 400 + "}\n"
        + '{"rollout_id": "x", "time": 4.0}\n'
        + '{"rollout_id": 3, "time": 5.0, "train/loss": 0.4}\n'
        + '{"rollout_id": 4, "ti')  # a torn last line: a writer still at it, no problem
    assert doctor([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "note: metrics.jsonl has values the verdicts do not see:" in out
    assert "line 2 (rollout 1): 'train/loss' is a JSON string, not a number (dropped)" in out
    assert "line 2 (rollout 1): 'train/grad_norm' is a JSON list" in out
    assert "line 2 (rollout 1): 'rollout/raw_reward' is a bool" in out
    assert "line 3 (rollout 2): 'train/loss' is an integer of 401 digits" in out
    assert "line 4: skipped: rollout_id is 'x', not an integer" in out
    assert "line 5" not in out and "line 6" not in out


def test_a_clean_journal_has_no_note(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text(GOOD + "\n")
    assert doctor([str(tmp_path)]) == 0
    assert "note:" not in capsys.readouterr().out
