"""Rollout-side metrics with Miles' names: rewards, lengths, truncation, zero-std groups, pass@k."""
from __future__ import annotations

import math
import statistics

from miles.rollout.advantages import groups_of, zero_std_counts
from miles.rollout.multi_turn_metrics import multi_turn_metrics
from miles.rollout.sample import Sample, Status


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_rates(samples: list[Sample], group_size: int) -> dict[str, float]:
    """`pass@k` for k = 1, 2, 4, ... up to the group size (a reward > 0 counts as a pass)."""
    if group_size < 1:
        return {}
    ks = [2 ** i for i in range(int(math.log2(group_size)) + 1)]
    groups = list(groups_of(samples).values())
    out = {}
    for k in ks:
        values = [pass_at_k(len(g), sum(1 for s in g if (s.reward or 0) > 0), k) for g in groups if len(g) >= k]
        out[f"pass@{k}"] = sum(values) / len(values) if values else 0.0
    return out


def degenerate_group_ratio(samples: list[Sample], advantages: list[float]) -> float:
    """The share of reward groups whose advantages do not vary (every sample the same): no GRPO signal."""
    groups: dict[object, list[float]] = {}
    for sample, advantage in zip(samples, advantages):
        groups.setdefault(sample.group_index, []).append(advantage)
    return sum(max(g) == min(g) for g in groups.values()) / len(groups) if groups else 0.0


def rollout_metrics(samples: list[Sample], advantages: list[float], group_size: int,
                    binary_reward: bool) -> dict[str, float]:
    """The `rollout/`, `passrate/` and (for multi-turn samples) `multi_turn/` metrics computable before
    training (no log-probs)."""
    lengths = [s.response_length for s in samples]
    n = len(samples)
    metrics = {
        "rollout/raw_reward": sum(s.raw_reward for s in samples) / n,
        # across-sample spread: a reward that saturates on one value loses it (the health watch reads it)
        "rollout/raw_reward_std": statistics.pstdev(s.raw_reward for s in samples),
        "rollout/rewards": sum(s.reward for s in samples) / n,
        "rollout/advantages": sum(advantages) / n,
        "rollout/response_lengths": sum(lengths) / n,
        "rollout/truncated": sum(s.truncated for s in samples) / n,
        "rollout/truncated_ratio": sum(s.truncated for s in samples) / n,
        # the engines' aborts (an abort storm empties a rollout of signal: aborted samples score 0)
        "rollout/aborted_ratio": sum(s.status == Status.ABORTED for s in samples) / n,
        "rollout/degenerate_group_ratio": degenerate_group_ratio(samples, advantages),
        "rollout/response_len/mean": sum(lengths) / n,
        "rollout/response_len/median": float(statistics.median(lengths)),
        "rollout/response_len/max": float(max(lengths)),
        "rollout/response_len/min": float(min(lengths)),
    }
    always = (0.0, 1.0) if binary_reward else ()
    metrics.update({f"rollout/{k}": float(v) for k, v in zero_std_counts(samples, always).items()})
    if group_size > 1:
        metrics.update({f"passrate/{k}": v for k, v in pass_rates(samples, group_size).items()})
    metrics.update(multi_turn_metrics(samples))
    return metrics
