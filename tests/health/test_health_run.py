"""A deliberately broken run (LR 100x the default) on the real loop: flagged live, flagged the same by
`miles doctor`, and with --on-red-flag stop it ends at once with a checkpoint, an error naming the flag
and the scorecard of a stopped run."""
from __future__ import annotations

import re

import pytest

from miles.health import RED, read_health_log
from miles.health.cli import main as doctor
from miles.train import main


# At this LR one step wrecks the policy; how depends on the sampled batch (the engines batch
# requests as they arrive, so a loaded machine samples other tokens) and on the base model: measured,
# the entropy collapses (1.99 -> 0.33 in one step), the answers degenerate into strings that run to
# the length limit (87% truncated at rollout 1), or every answer is wrong from rollout 1 on (reward
# 0.31 -> 0, so no group has a gradient: degenerate_groups flags that after 3 such rollouts, at
# rollout 3 on 2026-12-07, before raw_reward's 5-rollout window would).
COLLAPSE_SIGNALS = ("entropy_loss", "truncated_ratio", "raw_reward", "degenerate_groups")


@pytest.mark.slow
def test_lr_far_too_high_is_flagged_and_stops_with_a_checkpoint_and_a_scorecard(tmp_path, capsys,
                                                                                 ray_cluster):
    """One run through `python -m miles.train`'s main: the red flag live, the stop, the checkpoint,
    the scorecard of a stopped run, and `miles doctor` reading the same flag back."""
    run_dir = tmp_path / "run"
    code = main(["--run-dir", str(run_dir), "--lr", "0.05", "--num-rollout", "8",
                 "--eval-interval", "none", "--on-red-flag", "stop"])
    out = capsys.readouterr().out
    assert code == 1 and "[trainer] stopped: " in out, out[-3000:]
    card_at = out.index(f"python -m miles.train: scorecard of {run_dir}")
    stopped, card = out[out.index("[trainer] stopped: "):card_at], out[card_at:]  # the error, the card
    match = re.search(r"stopped by --on-red-flag stop: (\w+) at rollout (\d+)", stopped)
    assert match, stopped
    signal, rollout = match.group(1), int(match.group(2))
    assert signal in COLLAPSE_SIGNALS and rollout <= 5, stopped  # (the default run raises nothing)
    assert f"[health] WARN RED FLAG {signal} at rollout {rollout}" in out
    checkpoint = run_dir / "checkpoints" / f"iter_{rollout:07d}"
    assert str(checkpoint) in stopped and (checkpoint / "manifest.json").exists()
    live = [(v.rollout_id, v.signal) for v in read_health_log(run_dir) if v.severity == RED]
    # it stopped at the first red flag
    assert (rollout, signal) in live and all(r == rollout for r, _ in live)
    journal = (run_dir / "metrics.jsonl").read_text()
    assert journal.count(f'"health/{signal}": 1.0') == 1

    # the scorecard of a stopped run: the flag, the rollouts trained up to it, the checkpoint
    assert f"{signal} at rollout {rollout}" in card and f"{rollout + 1} (0..{rollout})" in card
    assert str(checkpoint) in card

    assert doctor([str(run_dir)]) == 1
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(signal))
    assert row.split()[1:3] == ["RED", str(rollout)]  # the same rollout as live
