"""R3 in a whole run: `python -m miles.train` on an MoE policy, its embedded engine serving bfloat16
behind the router, trained by Megatron with expert parallel 2 on 2 ranks, with
--use-rollout-routing-replay. The rollout asks the engine for routed experts over HTTP, the samples
carry them to the ranks, and train/r3_mismatch_fraction reaches the journal (which every tracker
is fed from); the sample table holds no record."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.moe import moe_checkpoint

REPO = Path(__file__).resolve().parents[2]
RUN_FLAGS = ["--train-backend", "megatron", "--actor-num-gpus-per-node", "2",
             "--expert-model-parallel-size", "2", "--num-rollout", "1", "--rollout-batch-size", "4",
             "--n-samples-per-prompt", "4", "--eval-interval", "none", "--engine-dtype", "bfloat16",
             "--use-rollout-routing-replay"]


@pytest.mark.slow
def test_a_replayed_moe_run_logs_the_mismatch_and_keeps_records_out_of_the_tables(tmp_path):
    model = moe_checkpoint(tmp_path / "moe")
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "miles.train", "--hf-checkpoint", str(model),
                           *RUN_FLAGS, "--run-dir", str(run_dir)], cwd=REPO, capture_output=True,
                          text=True, timeout=540)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [line for line in lines if line.get("rollout_id", -1) >= 0]
    assert len(trained) == 1
    assert 0.0 <= trained[0]["train/r3_mismatch_fraction"] <= 1.0
    assert trained[0]["train/train_rollout_logprob_abs_diff"] < 0.05  # bf16 alone, no routing jumps
    table = (run_dir / "samples" / "rollout_000000.jsonl").read_text()
    assert table and "routed" not in table
