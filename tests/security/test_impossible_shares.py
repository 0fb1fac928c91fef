"""Probe HA1: `rollout/aborted_ratio` and `rollout/degenerate_group_ratio` of 5 or 1e308 in a journal were
judged as real shares (a RED abort storm "aborted_ratio=5", exit 1), and -1 as "ok". A share outside
[0, 1] is now dropped like a string value: named above the doctor's table, no verdict rests on it."""
from __future__ import annotations

import json

import pytest

from miles.health.cli import main as doctor


def journal(tmp_path, value) -> None:
    rows = [{"rollout_id": i, "time": 1.0 + i, "train/loss": 0.5, "rollout/aborted_ratio": value,
             "rollout/degenerate_group_ratio": value, "rollout/truncated_ratio": value} for i in range(4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("value", [5, 1e308, -1, 1.0000001])
def test_a_share_outside_0_1_is_named_and_not_judged(tmp_path, capsys, value):
    journal(tmp_path, value)
    assert doctor([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"line 1 (rollout 0): 'rollout/aborted_ratio' is {value:g}, outside [0, 1] for a share (dropped)" in out
    for signal in ("abort_storm", "degenerate_groups", "truncated_ratio"):
        assert not any(signal in line and ("RED" in line or "WARN" in line) for line in out.splitlines()), out


def test_a_real_share_is_still_judged(tmp_path, capsys):
    journal(tmp_path, 0.9)
    assert doctor([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "abort_storm" in out and "outside [0, 1]" not in out
