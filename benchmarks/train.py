"""Training throughput: the FSDP2 backend (one rank, a Ray actor) against a plain torch loop over the
same model and batches, side by side; then the iteration time breakdown of the default config.

    .venv/bin/python benchmarks/train.py [--rounds 6] [--iterations 3] [--skip-loop]

Both sides do the same work per batch: a no-grad log-prob pass, then `--num-steps-per-rollout`
PPO steps over micro-batches with clipping and AdamW. Rounds alternate so a noisy machine
slows both alike. The last line is one JSON object with the figures and ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def synthetic_rollout(config, seed: int):
    """A rollout-shaped batch: arithmetic prompts, answer-like responses, random advantages."""
    import random

    from miles.rollout.sample import Sample
    from miles.tiny.task import split_problems

    rng = random.Random(seed)
    problems = split_problems(0)[0]
    samples, advantages = [], []
    for i in range(config.samples_per_rollout):
        p = problems[rng.randrange(len(problems))]
        prompt = [3 + ord(c) - 32 for c in p.prompt]
        answer = [3 + ord(c) - 32 for c in str(rng.randrange(199))] + [2]
        samples.append(Sample(index=i, group_index=i // config.rollout.n_samples_per_prompt, prompt=p.prompt,
                              label=p.label, tokens=prompt + answer, response_length=len(answer),
                              rollout_log_probs=[-1.0] * len(answer)))
        advantages.append(rng.gauss(0.0, 1.0))
    return samples, advantages


class PlainLoop:
    """The same PPO update written as a single-process torch loop: no FSDP, no Ray."""

    def __init__(self, config, model_path: Path, threads: int):
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.config = config
        self.model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
        c = config.train
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=c.lr, betas=(c.adam_beta1, c.adam_beta2),
                                           weight_decay=c.weight_decay, eps=1e-8, foreach=True)  # as the backend

    def train(self, batch) -> tuple[int, float]:
        from miles.backends.batch import micro_batches
        from miles.backends.fsdp.logprobs import token_stats
        from miles.backends.loss import ppo_clip_loss, sample_mean

        c, temp = self.config.train, self.config.rollout.rollout_temperature
        start = time.perf_counter()
        mbs = micro_batches(batch, c.micro_batch_size, 0, torch.device("cpu"))
        with torch.no_grad():
            self.model.eval()
            old = [token_stats(self.model, mb.input_ids, mb.attention_mask, temp).log_probs for mb in mbs]
        self.model.train()
        for step in range(len(batch.step_sizes)):
            self.optimizer.zero_grad(set_to_none=True)
            for i, mb in enumerate(mbs):
                if mb.step != step:
                    continue
                stats = token_stats(self.model, mb.input_ids, mb.attention_mask, temp)
                loss = ppo_clip_loss(stats.log_probs, old[i], mb.advantages, c.eps_clip, c.eps_clip)
                per_sample = sample_mean(loss.pg_losses, mb.response_mask)
                (per_sample.sum() / batch.global_step_sizes[step]).backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), c.clip_grad)
            self.optimizer.step()
        return sum(mb.num_tokens for mb in mbs), time.perf_counter() - start


def bench_backend(config, model_path: Path, rounds: int) -> dict:
    import ray

    from miles.backends.group import ActorGroup
    from miles.backends.pack import split_for_ranks

    threads = max(1, os.cpu_count() or 1)
    ray.init(num_cpus=max(2, threads), include_dashboard=False, log_to_driver=False, namespace="miles")
    group = ActorGroup(config, str(model_path))
    plain = PlainLoop(config, model_path, threads)
    fsdp_tps, loop_tps = [], []
    try:
        for r in range(rounds + 1):  # round 0 warms both up and is not counted
            samples, advantages = synthetic_rollout(config, seed=r)
            (batch,) = split_for_ranks(samples, advantages, config.global_batch_size, 1, rollout_id=r)
            (result,) = group.train([batch])
            tokens, seconds = plain.train(batch)
            if r:
                fsdp_tps.append(result.num_tokens / (result.log_probs_time + result.actor_train_time))
                loop_tps.append(tokens / seconds)
    finally:
        group.stop()
        ray.shutdown()
    return {"fsdp_tok_per_s": statistics.median(fsdp_tps), "plain_tok_per_s": statistics.median(loop_tps),
            "fsdp_vs_plain": statistics.median(fsdp_tps) / statistics.median(loop_tps)}


def bench_iterations(config, iterations: int) -> dict:
    import ray

    from miles.cluster.connect import connect
    from miles.cluster.local import start_inference
    from miles.prepare import prepare_config
    from miles.trainer import RLTrainer

    config = prepare_config(config.replace(eval_interval=None, run_dir=tempfile.mkdtemp(prefix="miles-bench-")))
    connect(None, config.orchestration.ray_num_cpus, config.orchestration.ray_object_store_mb)
    services = start_inference(config)
    trainer = None
    rows = []
    try:
        trainer = RLTrainer.start(config, services.rollout_url, services.engine_urls)
        trainer.resume()
        for r in range(iterations):
            rows.append(trainer.run_iteration(r).metrics)
    finally:
        if trainer is not None:
            trainer.close()
        services.stop()
        ray.shutdown()
    keys = ["perf/rollout_time", "perf/train_time", "perf/update_weights_time", "perf/step_time"]
    rows = rows[1:] or rows  # the first iteration pays one-off warm-up costs
    return {k.split("/")[1]: statistics.mean(row[k] for row in rows) for k in keys}


def main(argv=None) -> int:
    from miles.config import parse_config
    from miles.prepare import prepare_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="timed training rounds per side")
    parser.add_argument("--iterations", type=int, default=3, help="RL iterations for the time breakdown")
    parser.add_argument("--skip-loop", action="store_true", help="skip the RL iteration breakdown")
    args = parser.parse_args(argv)
    config = parse_config([])
    model_path = prepare_config(config).rollout.hf_checkpoint  # the tiny base model, made if missing

    tp = bench_backend(config, model_path, args.rounds)
    print(f"{'training (world size 1)':<28}{'tokens/s':>12}")
    print(f"{'FSDP2 backend (Ray actor)':<28}{tp['fsdp_tok_per_s']:>12.0f}")
    print(f"{'plain torch loop':<28}{tp['plain_tok_per_s']:>12.0f}")
    print(f"{'ratio FSDP / plain':<28}{tp['fsdp_vs_plain']:>12.2f}   (bar: >= 0.90)")
    result = {"train_throughput": tp}
    if not args.skip_loop:
        it = bench_iterations(config, args.iterations)
        print(f"\n{'default config iteration':<28}{'seconds':>12}{'share':>8}")
        for key in ("rollout_time", "train_time", "update_weights_time"):
            print(f"{key:<28}{it[key]:>12.2f}{it[key] / it['step_time']:>8.0%}")
        print(f"{'step_time (total)':<28}{it['step_time']:>12.2f}")
        result["iteration_breakdown_s"] = it
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
