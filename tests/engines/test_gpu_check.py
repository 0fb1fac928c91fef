"""benchmarks/gpu_check.py, the prepared CUDA check: it skips cleanly without CUDA, and its training step
runs (on CPU here) and changes the weights."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the check runs for real (minutes), not as a test")
def test_without_cuda_it_skips_cleanly(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"skipped": True, "reason": "no CUDA device"}
    assert not (tmp_path / "o").exists()  # nothing started, nothing written


def test_its_training_step_runs_and_moves_the_weights(base_model):
    sys.path.insert(0, str(ROOT))
    from benchmarks.gpu_check import one_step
    from miles.backends.ppo import build_optimizer
    from miles.config import TrainConfig
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loss = one_step(model, build_optimizer(model.parameters(), TrainConfig()), torch.device("cpu"))
    assert torch.isfinite(torch.tensor(loss))
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
