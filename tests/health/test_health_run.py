"""A deliberately broken run (LR 100x the default) on the real loop: flagged live, flagged the same by
`miles doctor`, and with --on-red-flag stop it ends at once with a checkpoint and an error naming the flag."""
from __future__ import annotations

import re

import pytest

from miles.config import parse_config
from miles.prepare import prepare_config
from miles.health.cli import main as doctor
from miles.health import RED, RedFlagStop, read_health_log
from miles.train import train


# At this LR one step wrecks the policy; how depends on the sampled batch (the engines batch
# requests as they arrive, so a loaded machine samples other tokens) and on the base model: measured,
# the entropy collapses (1.99 -> 0.33 in one step), the answers degenerate into strings that run to
# the length limit (87% truncated at rollout 1), or every answer is wrong from rollout 1 on (reward
# 0.31 -> 0, so no group has a gradient; flagged once it stayed at 0 for the watch's 5 rollouts).
COLLAPSE_SIGNALS = ("entropy_loss", "truncated_ratio", "raw_reward")


@pytest.mark.slow
def test_lr_far_too_high_is_flagged_and_stops_with_a_checkpoint(tmp_path, capsys, ray_cluster):
    run_dir = tmp_path / "run"
    config = parse_config(["--run-dir", str(run_dir), "--lr", "0.05", "--num-rollout", "8", "--eval-interval",
                           "none", "--on-red-flag", "stop"])
    with pytest.raises(RedFlagStop) as stopped:
        train(prepare_config(config))
    match = re.search(r"stopped by --on-red-flag stop: (\w+) at rollout (\d+)", str(stopped.value))
    assert match, str(stopped.value)
    signal, rollout = match.group(1), int(match.group(2))
    assert signal in COLLAPSE_SIGNALS and rollout <= 5, str(stopped.value)  # the default run raises nothing
    assert f"[health] WARN RED FLAG {signal} at rollout {rollout}" in capsys.readouterr().out
    checkpoint = run_dir / "checkpoints" / f"iter_{rollout:07d}"
    assert str(checkpoint) in str(stopped.value) and (checkpoint / "manifest.json").exists()
    live = [(v.rollout_id, v.signal) for v in read_health_log(run_dir) if v.severity == RED]
    assert (rollout, signal) in live and all(r == rollout for r, _ in live)  # it stopped at the first red flag
    journal = (run_dir / "metrics.jsonl").read_text()
    assert journal.count(f'"health/{signal}": 1.0') == 1

    assert doctor([str(run_dir)]) == 1
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(signal))
    assert row.split()[1:3] == ["RED", str(rollout)]  # the same rollout as live


@pytest.mark.slow
def test_a_run_stopped_by_a_red_flag_still_prints_its_scorecard(tmp_path, capsys, ray_cluster):
    from miles.train import main

    run_dir = tmp_path / "run"
    # answers of two digits and an end token cannot fit in 2 tokens: truncated_ratio is red at rollout 0
    code = main(["--run-dir", str(run_dir), "--num-rollout", "3", "--rollout-batch-size", "8",
                 "--n-samples-per-prompt", "4", "--eval-interval", "none", "--rollout-max-response-len", "2",
                 "--on-red-flag", "stop"])
    out = capsys.readouterr().out
    assert code == 1 and "[trainer] stopped: " in out
    card = out[out.index(f"python -m miles.train: scorecard of {run_dir}"):]
    assert "truncated_ratio at rollout 0" in card and "1 (0..0)" in card  # one rollout trained, then stopped
    assert str(run_dir / "checkpoints" / "iter_0000000") in card
