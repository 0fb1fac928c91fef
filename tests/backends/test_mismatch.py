"""The train-vs-rollout mismatch figures (miles.backends.mismatch) against hand-computed values."""
from __future__ import annotations

import math

import pytest
import torch

from miles.backends.mismatch import (LOG_RATIO_EDGES, MismatchSums, MismatchTally, merge, metrics,
                                     position_bucket_names)

CPU = torch.device("cpu")


def tally_of(batches, low=0.0, high=2.0) -> MismatchSums:
    tally = MismatchTally(low, high, CPU)
    for train_lp, rollout_lp, mask, adv in batches:
        tally.add(train_lp, rollout_lp, mask, adv)
    return tally.result()


def batch(log_r, adv, mask=None, rollout=-1.0):
    log_r = torch.tensor(log_r, dtype=torch.float32)
    mask = torch.ones_like(log_r) if mask is None else torch.tensor(mask, dtype=torch.float32)
    adv = torch.tensor(adv, dtype=torch.float32).expand_as(log_r)
    return rollout + log_r, torch.full_like(log_r, rollout), mask, adv


def test_estimators_equal_hand_computed_values():
    # one sample, log r = 0.5, -0.2, 0.1 (train minus rollout); a padded position out of the mask
    m = metrics(tally_of([batch([[0.5, -0.2, 0.1, 3.0]], [[1.0, 1.0, 1.0, 1.0]], [[1, 1, 1, 0]])]))
    logs = [0.5, -0.2, 0.1]
    assert m["train/mismatch_k1"] == pytest.approx(sum(-x for x in logs) / 3, rel=1e-5)
    assert m["train/mismatch_k1"] < 0  # k1's mean can be negative on a sample: unbiased, not >= 0
    assert m["train/mismatch_k2"] == pytest.approx(sum(x * x / 2 for x in logs) / 3, rel=1e-5)
    k3 = sum(math.exp(x) - 1 - x for x in logs) / 3
    assert m["train/mismatch_k3"] == pytest.approx(k3, rel=1e-5)
    assert m["train/mismatch_ratio_max"] == pytest.approx(math.exp(0.5), rel=1e-6)
    # 3 tokens: the nearest-rank p99 is the max
    assert m["train/mismatch_ratio_p99"] == pytest.approx(math.exp(0.5), rel=1e-6)
    # advantage +1 everywhere: the token whose ratio is below 1 (log r = -0.2) pushes the other way
    assert m["train/mismatch_adv_opposed_frac"] == pytest.approx(1 / 3)
    assert m["train/mismatch_ratio_beyond_tis_clip"] == 0.0  # all of r in [0, 2]


def test_k3_is_never_negative_and_tis_clip_share_counts_both_sides():
    log_r = torch.linspace(-3, 3, 61).reshape(1, -1).tolist()
    s = tally_of([batch(log_r, [[-1.0]])], low=0.5, high=2.0)
    assert s.sums["k3"] >= 0 and metrics(s)["train/mismatch_k3"] > 0
    beyond = sum(1 for x in log_r[0] if math.exp(x) > 2.0 or math.exp(x) < 0.5)
    assert metrics(s)["train/mismatch_ratio_beyond_tis_clip"] == pytest.approx(beyond / 61)
    tiny = tally_of([batch([[1e-6, -1e-6, 2e-7]], [[1.0]])])
    assert tiny.sums["k3"] >= 0  # float rounding of exp(x) - 1 - x near 0 held at 0, not below
    assert tiny.sums["adv_opposed"] == 0  # a sign in the rounding noise is no push either way


def test_two_micro_batches_and_two_ranks_equal_one_batch():
    gen = torch.Generator().manual_seed(0)
    log_r = (torch.randn(4, 40, generator=gen) * 0.3).tolist()
    adv = [[1.0], [-1.0], [0.5], [-2.0]]
    mask = [[1] * 40, [1] * 25 + [0] * 15, [0] * 5 + [1] * 30 + [0] * 5, [1] * 10 + [0] * 30]
    whole = metrics(tally_of([batch(log_r, adv, mask)]))
    micro = metrics(tally_of([batch(log_r[:1], adv[:1], mask[:1]),
                              batch(log_r[1:], adv[1:], mask[1:])]))
    ranks = metrics(merge([tally_of([batch(log_r[:3], adv[:3], mask[:3])]), None,
                           tally_of([batch(log_r[3:], adv[3:], mask[3:])])]))
    assert whole.keys() == micro.keys() == ranks.keys()
    for key, value in whole.items():
        assert micro[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
        assert ranks[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    # token means, not means of samples' means: the 10-token sample weighs 10 / 105 of k3
    flat = [x for row, m in zip(log_r, mask) for x, on in zip(row, m) if on]
    k3 = sum(math.exp(x) - 1 - x for x in flat) / len(flat)
    assert whole["train/mismatch_k3"] == pytest.approx(k3, rel=1e-5)


def test_p99_from_the_histogram_brackets_the_exact_one():
    gen = torch.Generator().manual_seed(1)
    log_r = torch.randn(8, 500, generator=gen) * 0.05
    s = tally_of([batch(log_r.tolist(), [[1.0]])])
    got = metrics(s)["train/mismatch_ratio_p99"]
    flat = log_r.flatten().sort().values
    exact = flat[math.ceil(0.99 * flat.numel()) - 1].item()  # nearest rank
    assert math.exp(exact) <= got * (1 + 1e-6)
    assert math.log(got) <= exact * 10 ** 0.02 + 1e-6  # at most one bin (50 per decade) above
    assert sum(s.histogram) == 4000 and len(s.histogram) == len(LOG_RATIO_EDGES) + 1


def test_zero_mismatch_gives_zeros():
    m = metrics(tally_of([batch([[0.0] * 6, [0.0] * 6], [[1.0], [-1.0]])]))
    for name in ("k1", "k2", "k3", "ratio_beyond_tis_clip", "adv_opposed_frac"):
        assert m[f"train/mismatch_{name}"] == 0.0, name
    assert m["train/mismatch_ratio_max"] == 1.0 and m["train/mismatch_ratio_p99"] == 1.0
    assert metrics(MismatchSums()) == {}  # no response tokens: nothing to report


def test_positions_are_counted_from_each_response_start():
    # the response starts at column 2 (after the prompt); its tokens 0-3 and 4-5 land in two buckets
    log_r = [[0.0, 0.0, 0.1, 0.1, 0.1, 0.1, 0.4, 0.4]]
    m = metrics(tally_of([batch(log_r, [[1.0]], [[0, 0, 1, 1, 1, 1, 1, 1]])]))
    first, second = position_bucket_names()[:2]
    assert (first, second) == ("0-4", "4-8")
    assert m[f"train/mismatch_pos/tokens/{first}"] == pytest.approx(4 / 6)
    assert m[f"train/mismatch_pos/abs_diff/{first}"] == pytest.approx(0.1, rel=1e-5)
    assert m[f"train/mismatch_pos/abs_diff/{second}"] == pytest.approx(0.4, rel=1e-5)
    assert m[f"train/mismatch_pos/k3/{second}"] == pytest.approx(math.exp(0.4) - 1.4, rel=1e-4)
    assert not any(k.endswith("/8-16") for k in m)  # empty buckets are not reported
