"""What the train-vs-rollout mismatch figures (miles.backends.mismatch) add to a training step: the
rank's `MismatchTally` over its micro-batches vs the training passes over the same micro-batches.

    .venv/bin/python benchmarks/mismatch_overhead.py [--model DIR] [--reps 15]

The tiny run's shapes (the default config: 32 prompts x 8 samples, responses of at most 8 tokens,
two training ranks, micro-batches of 64, one thread per rank): one rank's 128 samples are collated
as `PPORank.train` collates them (`miles.backends.batch.micro_batches`) and, alternating, timed
(a) the tally over every micro-batch and its copy to the CPU (`result`), what a step adds, and
(b) the step's own work on the same micro-batches: the tiny model's log-prob forward and a
training forward and backward. Each figure is the median of --reps. Also the tally alone on a
long-response shape (8 samples x 4096 positions). Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from miles.backends.base import RankBatch  # noqa: E402
from miles.backends.batch import micro_batches  # noqa: E402
from miles.backends.mismatch import MismatchTally  # noqa: E402

CPU = torch.device("cpu")


def rank_batch(samples: int, prompt: int, response: int, vocab: int) -> RankBatch:
    rng = random.Random(0)
    lengths = [rng.randint(1, response) for _ in range(samples)]
    tokens = [[rng.randrange(vocab) for _ in range(prompt + n)] for n in lengths]
    return RankBatch(tokens=tokens, response_lengths=lengths,
                     advantages=[rng.gauss(0, 1) for _ in range(samples)],
                     rollout_log_probs=[[-rng.random() for _ in range(n)] for n in lengths],
                     step_sizes=[samples], global_step_sizes=[2 * samples], rollout_id=0)


def tally_seconds(mbs, log_probs) -> float:
    start = time.perf_counter()
    tally = MismatchTally(0.0, 2.0, CPU)
    for mb, lp in zip(mbs, log_probs):
        tally.add(lp, mb.rollout_log_probs, mb.response_mask, mb.advantages)
    tally.result()
    return time.perf_counter() - start


def step_seconds(model, mbs) -> float:
    start = time.perf_counter()
    for mb in mbs:
        with torch.no_grad():
            model(input_ids=mb.input_ids, attention_mask=mb.attention_mask)
        out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask)
        out.logits.float().log_softmax(-1).mean().backward()
    return time.perf_counter() - start


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=str(next((Path.home() / ".cache/miles").glob("tiny-base-*"))))
    p.add_argument("--reps", type=int, default=15)
    args = p.parse_args(argv)
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)  # a rank's threads (PPORank's default)
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32)
    mbs = micro_batches(rank_batch(128, 6, 8, model.config.vocab_size), 64, 0, CPU)
    log_probs = [mb.rollout_log_probs + 1e-6 * torch.randn_like(mb.rollout_log_probs) for mb in mbs]
    tally, step = [], []
    for _ in range(args.reps):  # alternating, so a noisy neighbour hits both alike
        tally.append(tally_seconds(mbs, log_probs))
        step.append(step_seconds(model, mbs))
    long_mbs = micro_batches(rank_batch(8, 64, 4032, model.config.vocab_size), 8, 0, CPU)
    long_lp = [mb.rollout_log_probs + 1e-3 for mb in long_mbs]
    long_tally = statistics.median(tally_seconds(long_mbs, long_lp) for _ in range(args.reps))
    t, s = statistics.median(tally), statistics.median(step)
    print(json.dumps({"micro_batches": len(mbs), "tally_ms": round(1e3 * t, 3),
                      "step_work_ms": round(1e3 * s, 1), "overhead": round(t / s, 5),
                      "long_tally_ms_8x4096": round(1e3 * long_tally, 3)}))


if __name__ == "__main__":
    main()
