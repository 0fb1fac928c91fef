"""The training ranks as Ray actors, driven without an engine: made-up rollouts, the configs of the
backend tests, one training call, and the weights a group exports."""
from __future__ import annotations

import random

from miles.backends.pack import combine, split_for_ranks
from miles.config import parse_config
from miles.rollout.sample import Sample
from miles.tiny.task import split_problems

# The Megatron tests' groups train with the reference model, KL and entropy terms, so each
# comparison covers the whole loss.
LOSS = dict(use_kl_loss="true", kl_loss_coef=0.1, kl_loss_type="k3", entropy_coef=0.01)


def rollout_like(n=16, seed=0):
    """Arithmetic prompts with made-up answers, advantages and engine log-probs (tokens: chars +
    EOS)."""
    rng = random.Random(seed)
    problems = split_problems(0)[0][:n]
    samples = []
    for i, p in enumerate(problems):
        # the tiny tokenizer: printable chars after 3 specials
        prompt = [3 + ord(c) - 32 for c in p.prompt]
        answer = [3 + ord(c) - 32 for c in str(rng.randrange(200))] + [2]
        samples.append(Sample(index=i, group_index=i // 4, prompt=p.prompt, label=p.label,
                              tokens=prompt + answer, response_length=len(answer),
                              rollout_log_probs=[-1.0] * len(answer)))
    return samples, [rng.gauss(0, 1) for _ in samples]


def config(world_size, **extra):
    """Two optimizer steps of 8 samples per call, micro-batches of 2, on `world_size` ranks."""
    argv = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--micro-batch-size", "2",
            "--num-steps-per-rollout", "2", "--actor-num-gpus-per-node", str(world_size),
            "--lr", "1e-3"]
    for key, value in extra.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return parse_config(argv)


def megatron(world_size):
    return config(world_size, train_backend="megatron", **LOSS)


def fsdp(world_size):
    return config(world_size, **LOSS)


def step(group, cfg, samples, advantages):
    batches = split_for_ranks(samples, advantages, cfg.global_batch_size, cfg.world_size,
                              rollout_id=0)
    return combine(group.train(batches))


def weights(group):
    return group.call("export_weights", None)[0]


def max_abs_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)
