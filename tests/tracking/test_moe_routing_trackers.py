"""A real tiny MoE run (`python -m miles.train`, the untrained tiny Qwen3-MoE served by the
embedded engine and trained by FSDP) with every tracker on: the routing figures of its training
passes and the router_collapse signal reach MLflow, wandb (offline) and TensorBoard exactly as the
journal holds them."""
from __future__ import annotations

import subprocess
import sys

import pytest
from tracking_helpers import (ALL_TRACKERS, REPO, assert_all_trackers_equal_journal,
                              subprocess_env)

from miles.tiny.moe_model import build_tiny_moe_model
from miles.tiny.warmstart import save_checkpoint

FLAGS = ["--num-rollout", "2", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
         "--eval-interval", "none", "--log-samples-interval", "none"]


@pytest.mark.slow
def test_routing_metrics_reach_every_tracker(tmp_path):
    model = tmp_path / "moe"
    save_checkpoint(*build_tiny_moe_model(0), model)
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "miles.train", "--hf-checkpoint", str(model),
                           "--run-dir", str(run_dir), *FLAGS, *ALL_TRACKERS], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    points = assert_all_trackers_equal_journal(run_dir)
    for layer in (0, 1):
        for figure in ("load_balancing_loss", "expert_imbalance", "max_expert_share",
                       "busiest_expert", "dead_experts", "router_entropy"):
            assert [s for s, _ in points[f"moe/{figure}_layer_{layer}"]] == [0, 1]
    assert [s for s, _ in points["moe/load_balancing_loss"]] == [0, 1]  # on rollout/step
    assert all(1.0 <= v <= 2.0 for _, v in points["moe/load_balancing_loss"])  # 1 even, E/k = 2
    assert points["health/router_collapse"] == [(0, 0.0), (1, 0.0)]
