"""Helpers of the profiling tests (and benchmarks/profiling.py): small configs and a made-up rollout."""
import random

from miles.config import parse_config
from miles.rollout.sample import Sample


def profiling_config(tmp_path, *extra):
    argv = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--micro-batch-size", "4",
            "--num-steps-per-rollout", "2", "--num-rollout", "6", "--lr", "1e-3", "--run-dir", str(tmp_path / "run"),
            *extra]
    return parse_config(argv)


def made_up_rollout(n=8, seed=0):
    """Short arithmetic-like token rows with made-up advantages and engine log-probs (tiny tokenizer ids)."""
    rng = random.Random(seed)
    samples = []
    for i in range(n):
        prompt = [3 + ord(c) - 32 for c in f"{rng.randrange(50)}+{rng.randrange(50)}="]
        answer = [3 + ord(c) - 32 for c in str(rng.randrange(100))] + [2]
        samples.append(Sample(index=i, group_index=i // 4, prompt="", label="", tokens=prompt + answer,
                              response_length=len(answer), rollout_log_probs=[-1.0] * len(answer)))
    return samples, [rng.gauss(0, 1) for _ in samples]
