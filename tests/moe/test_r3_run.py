"""R3 in a whole run: `python -m miles.train` on an MoE policy, its embedded engine serving bfloat16
behind the router, trained by Megatron with expert parallel 2 on 2 ranks, with
--use-rollout-routing-replay and every tracker on. The rollout asks the engine for routed experts
over HTTP, the samples carry them to the ranks, and train/r3_mismatch_fraction reaches the journal;
the sample table holds no record. The same run's routing figures and router_collapse signal reach
MLflow, wandb (offline) and TensorBoard exactly as the journal holds them (one run serves both
checks: each whole run costs tens of seconds of start-up, docs/developer/testing.md)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.moe import moe_checkpoint
from tests.tracking.tracking_helpers import (ALL_TRACKERS, REPO,
                                             assert_all_trackers_equal_journal, subprocess_env)

RUN_FLAGS = ["--train-backend", "megatron", "--actor-num-gpus-per-node", "2",
             "--expert-model-parallel-size", "2", "--num-rollout", "2", "--rollout-batch-size", "4",
             "--n-samples-per-prompt", "4", "--eval-interval", "none", "--engine-dtype", "bfloat16",
             "--use-rollout-routing-replay", *ALL_TRACKERS]


@pytest.fixture(scope="module")
def r3_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("r3")
    model = moe_checkpoint(tmp / "moe")
    run_dir = tmp / "run"
    done = subprocess.run([sys.executable, "-m", "miles.train", "--hf-checkpoint", str(model),
                           *RUN_FLAGS, "--run-dir", str(run_dir)], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return run_dir


@pytest.mark.slow
def test_a_replayed_moe_run_logs_the_mismatch_and_keeps_records_out_of_the_tables(r3_run):
    lines = [json.loads(line) for line in (r3_run / "metrics.jsonl").read_text().splitlines()]
    trained = [line for line in lines if line.get("rollout_id", -1) >= 0]
    assert [line["rollout_id"] for line in trained] == [0, 1]
    for line in trained:
        assert 0.0 <= line["train/r3_mismatch_fraction"] <= 1.0
        assert line["train/train_rollout_logprob_abs_diff"] < 0.05  # bf16 alone, no routing jumps
    for rollout in (0, 1):
        table = (r3_run / "samples" / f"rollout_{rollout:06d}.jsonl").read_text()
        assert table and "routed" not in table


@pytest.mark.slow
def test_routing_metrics_reach_every_tracker(r3_run):
    points = assert_all_trackers_equal_journal(r3_run)
    for layer in (0, 1):  # EP=2: both layers on every rank, the experts split
        for figure in ("load_balancing_loss", "expert_imbalance", "max_expert_share",
                       "busiest_expert", "dead_experts", "router_entropy"):
            assert [s for s, _ in points[f"moe/{figure}_layer_{layer}"]] == [0, 1]
    assert [s for s, _ in points["moe/load_balancing_loss"]] == [0, 1]  # on rollout/step
    assert all(1.0 <= v <= 2.0 for _, v in points["moe/load_balancing_loss"])  # 1 even, E/k = 2
    assert points["health/router_collapse"] == [(0, 0.0), (1, 0.0)]
    assert len(points["train/r3_mismatch_fraction"]) == 2  # R3's own figure, in every tracker too
