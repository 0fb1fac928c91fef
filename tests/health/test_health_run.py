"""A deliberately broken run (LR 100x the default) on the real loop: flagged live, flagged the same by
`miles doctor`, and with --on-red-flag stop it ends at once with a checkpoint and an error naming the flag."""
from __future__ import annotations

import pytest

from miles.config import parse_config
from miles.doctor import main as doctor
from miles.health import RED, RedFlagStop, read_health_log
from miles.train import train


@pytest.mark.slow
def test_lr_far_too_high_is_flagged_and_stops_with_a_checkpoint(tmp_path, capsys):
    run_dir = tmp_path / "run"
    config = parse_config(["--run-dir", str(run_dir), "--lr", "0.05", "--num-rollout", "8", "--eval-interval",
                           "none", "--on-red-flag", "stop"])
    with pytest.raises(RedFlagStop, match="entropy_loss at rollout 1: entropy fell to") as stopped:
        train(config)
    out = capsys.readouterr().out
    assert "[health] WARN RED FLAG entropy_loss at rollout 1" in out and "mode collapse" in out
    # measured: entropy 1.99 -> 0.33 in one step at this LR (the default run takes ~60 rollouts to reach 0.33)
    checkpoint = run_dir / "checkpoints" / "iter_0000001"
    assert str(checkpoint) in str(stopped.value) and (checkpoint / "manifest.json").exists()
    live = [v for v in read_health_log(run_dir) if v.severity == RED]
    assert [(v.rollout_id, v.signal) for v in live] == [(1, "entropy_loss")]
    assert (run_dir / "metrics.jsonl").read_text().count('"health/entropy_loss": 1.0') == 1

    assert doctor([str(run_dir)]) == 1
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("entropy_loss"))
    assert row.split()[1:4] == ["RED", "1", "1"]  # the same rollout as live
