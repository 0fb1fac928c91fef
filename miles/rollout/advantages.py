"""Advantages from rewards: GRPO group normalisation or REINFORCE++ batch whitening."""
from __future__ import annotations

from collections import defaultdict

import torch

from miles.rollout.sample import Sample

EPS = 1e-6


def groups_of(samples: list[Sample]) -> dict[int, list[Sample]]:
    groups: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        groups[s.group_index].append(s)
    return dict(groups)


def grpo_advantages(samples: list[Sample], normalize_std: bool = True) -> list[float]:
    """(r - mean of the group) / (std of the group + eps); a zero-std group gets all zeros."""
    out = [0.0] * len(samples)
    position = {id(s): i for i, s in enumerate(samples)}
    for group in groups_of(samples).values():
        rewards = torch.tensor([s.reward for s in group], dtype=torch.float64)
        centred = rewards - rewards.mean()
        if normalize_std and len(group) > 1:
            centred = centred / (rewards.std() + EPS)  # unbiased std, as slime/Miles do
        for s, a in zip(group, centred.tolist()):
            out[position[id(s)]] = a
    return out


def reinforce_plus_plus_advantages(samples: list[Sample]) -> list[float]:
    """REINFORCE++ (no critic): the return of every token is the sample's reward (the KL
    term lives in the loss), whitened over all response tokens of the batch."""
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float64)
    lengths = torch.tensor([max(1, s.response_length) for s in samples], dtype=torch.float64)
    mean = (rewards * lengths).sum() / lengths.sum()
    var = ((rewards - mean) ** 2 * lengths).sum() / lengths.sum()
    return ((rewards - mean) / (var.sqrt() + EPS)).tolist()


def compute_advantages(samples: list[Sample], estimator: str, normalize_std: bool = True) -> list[float]:
    if estimator == "grpo":
        return grpo_advantages(samples, normalize_std)
    if estimator == "reinforce_plus_plus":
        return reinforce_plus_plus_advantages(samples)
    raise ValueError(f"unknown --advantage-estimator {estimator!r}")


def zero_std_counts(samples: list[Sample], always: tuple[float, ...] = ()) -> dict[str, int]:
    """Miles' `zero_std/count_<reward>`: how many groups had one reward for every sample
    (they carry no GRPO signal), keyed by that reward rounded to 0.1."""
    counts = {f"zero_std/count_{round(v, 1)}": 0 for v in always}
    for group in groups_of(samples).values():
        rewards = [s.reward for s in group]
        if all(r == rewards[0] for r in rewards):
            key = f"zero_std/count_{round(rewards[0], 1)}"
            counts[key] = counts.get(key, 0) + 1
    return counts
