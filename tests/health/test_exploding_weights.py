"""C3b: `--lr 1e30` destroys the weights in one step; the health watch's param_norm flag fires at once,
names the learning rate and advises lowering it (before: exit 0, only a truncated_ratio flag), in both backends."""
from __future__ import annotations

import pytest

from miles.config import parse_config
from miles.health import RED, RedFlagStop, read_health_log
from miles.prepare import prepare_config
from miles.train import train


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["fsdp", "megatron"])
def test_a_huge_lr_is_flagged_as_exploding_weights(tmp_path, capsys, backend, ray_cluster):
    run_dir = tmp_path / "run"
    config = parse_config(["--run-dir", str(run_dir), "--lr", "1e30", "--num-rollout", "2", "--eval-interval",
                           "none", "--on-red-flag", "stop", "--train-backend", backend])
    with pytest.raises(RedFlagStop) as stopped:
        train(prepare_config(config))
    assert "param_norm at rollout 0: weights exploding" in str(stopped.value), str(stopped.value)
    assert "at lr 1e+30" in str(stopped.value)
    out = capsys.readouterr().out
    assert "[health] WARN RED FLAG param_norm at rollout 0" in out and "learning rate too high" in out
    flagged = [v for v in read_health_log(run_dir) if v.severity == RED and v.signal == "param_norm"]
    assert flagged and flagged[0].values["train/lr"] == 1e30 and flagged[0].values["train/param_norm_growth"] >= 10
