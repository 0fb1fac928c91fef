"""Advantages: GRPO group normalisation, REINFORCE++ whitening, zero-std group accounting."""
import math

import pytest

from miles.rollout.advantages import compute_advantages, zero_std_counts
from miles.rollout.sample import Sample


def group(g, rewards, start=0, length=3):
    return [Sample(index=start + i, group_index=g, prompt="p", label="l", reward=r, raw_reward=r,
                   response_length=length) for i, r in enumerate(rewards)]


def test_grpo_normalises_within_each_group():
    samples = group(0, [1.0, 0.0, 0.0, 0.0]) + group(1, [1.0, 1.0, 1.0, 1.0], start=4)
    adv = compute_advantages(samples, "grpo")
    # group 0: mean 0.25, unbiased std sqrt(0.1875*4/3)=0.5 -> (0.75/0.5, -0.25/0.5 x3)
    assert adv[:4] == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    assert adv[4:] == [0.0] * 4  # zero-std group: no signal


def test_grpo_without_std_only_centres():
    adv = compute_advantages(group(0, [1.0, 0.0]), "grpo", normalize_std=False)
    assert adv == pytest.approx([0.5, -0.5])


def test_reinforce_plus_plus_whitens_over_tokens():
    samples = group(0, [1.0, 0.0], length=1) + group(1, [0.0, 0.0], start=2, length=1)
    adv = compute_advantages(samples, "reinforce_plus_plus")
    # rewards 1,0,0,0: mean 0.25, population std sqrt(0.1875)
    s = math.sqrt(0.1875)
    assert adv == pytest.approx([0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s], abs=1e-5)
    assert sum(adv) == pytest.approx(0.0, abs=1e-9)


def test_zero_std_counts_keyed_by_reward():
    samples = group(0, [1.0, 1.0]) + group(1, [0.0, 0.0], start=2) + group(2, [0.0, 0.0], start=4) \
        + group(3, [1.0, 0.0], start=6)
    assert zero_std_counts(samples) == {"zero_std/count_1.0": 1, "zero_std/count_0.0": 2}
    assert zero_std_counts(group(0, [1.0, 0.0]), always=(0.0, 1.0)) == \
        {"zero_std/count_0.0": 0, "zero_std/count_1.0": 0}


def test_unknown_estimator_is_an_error():
    with pytest.raises(ValueError, match="ppo_v9"):
        compute_advantages(group(0, [1.0]), "ppo_v9")
