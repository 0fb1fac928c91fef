"""Synthetic health streams shared by the detector and watch tests: a healthy run shaped like the default
tiny run, and the same stream broken from a rollout on."""
from __future__ import annotations

import math
import random

from miles.config.health import HealthConfig
from miles.health import Rollout, RunFacts

CFG = HealthConfig()
RUN = RunFacts(clip_grad=1.0, groups_per_rollout=32, use_kl_loss=True)
N = 60


def healthy_row(i: int, rng: random.Random, noise: float) -> dict[str, float]:
    """One rollout of a learning run shaped like the default tiny run (its scales measured there);
    `noise` scales random wobble around those trends."""
    def wobble(scale: float) -> float:
        return noise * scale * rng.gauss(0.0, 1.0)

    reward = min(0.25 + 0.01 * i + wobble(0.05), 0.95)
    return {
        "train/loss": 0.4 * math.exp(-i / 200) + wobble(0.02),
        "rollout/raw_reward": reward,
        "rollout/raw_reward_std": math.sqrt(max(reward * (1 - reward), 0.01)),
        "rollout/zero_std/count_0.0": float(rng.randint(0, 3)),
        "rollout/zero_std/count_1.0": float(rng.randint(0, 6)),
        "train/kl_loss": 0.001 + 0.0002 * i + abs(wobble(0.0005)),
        "train/train_rollout_logprob_abs_diff": 3e-7 + abs(wobble(1e-7)),
        "train/entropy_loss": 2.0 * math.exp(-i / 40) + abs(wobble(0.05)),
        "train/grad_norm": max(0.9 + wobble(0.3), 0.3),  # the default run: about half at or above clip
        "train/pg_clipfrac": abs(wobble(0.02)),
        "perf/rollout_time": 1.4 + abs(wobble(0.8)),
        "perf/train_time": 0.15 + abs(wobble(0.8)),
        "perf/update_weights_time": 0.06 + abs(wobble(0.02)),
        "perf/step_time": 1.7 + abs(wobble(1.5)),
        "rollout/truncated_ratio": abs(wobble(0.01)),
        "rollout/router_requests": 256.0, "rollout/router_errors": 0.0, "rollout/router_retries": 0.0,
        "rollout/router_no_worker": 0.0,
        "rollout/aborted_ratio": 0.0,
        "rollout/degenerate_group_ratio": rng.randint(0, 9) / 32,  # the zero-std counts above, at most
    }


def stream(noise: float = 1.0, seed: int = 0, n: int = N) -> list[Rollout]:
    rng = random.Random(seed)
    return [Rollout(i, healthy_row(i, rng, noise)) for i in range(n)]


def broken(rollouts: list[Rollout], start: int, **changes) -> list[Rollout]:
    """From rollout `start` on, each change (key -> fn(i, value)) rewrites a metric."""
    out = []
    for r in rollouts:
        metrics = dict(r.metrics)
        if r.rollout_id >= start:
            for key, fn in changes.items():
                metrics[key.replace("__", "/")] = fn(r.rollout_id - start, metrics.get(key.replace("__", "/")))
        out.append(Rollout(r.rollout_id, metrics))
    return out


# the rollout from which the broken streams of the tests go wrong
START = 30
