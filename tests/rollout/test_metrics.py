"""Rollout metrics: the unbiased pass@k estimator and Miles' metric names."""
import pytest

from miles.rollout.metrics import pass_at_k, pass_rates, rollout_metrics
from miles.rollout.sample import Sample, Status


def test_pass_at_k_estimator():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 3, 2) == 1.0


def samples():
    rows = [(0, 1.0, 2, Status.COMPLETED), (0, 0.0, 4, Status.TRUNCATED),
            (1, 0.0, 3, Status.COMPLETED), (1, 0.0, 3, Status.COMPLETED)]
    return [Sample(index=i, group_index=g, prompt="p", label="l", reward=r, raw_reward=r, response_length=n,
                   status=st) for i, (g, r, n, st) in enumerate(rows)]


def test_pass_rates_per_power_of_two():
    assert pass_rates(samples(), 2) == {"pass@1": pytest.approx(0.25), "pass@2": pytest.approx(0.5)}


def test_rollout_metrics_names_and_values():
    m = rollout_metrics(samples(), [1.0, -1.0, 0.0, 0.0], group_size=2, binary_reward=True)
    assert m["rollout/raw_reward"] == 0.25 and m["rollout/rewards"] == 0.25
    assert m["rollout/raw_reward_std"] == pytest.approx(0.25 ** 0.5 * 0.75 ** 0.5)  # binary: sqrt(p (1 - p))
    assert m["rollout/truncated_ratio"] == 0.25 and m["rollout/truncated"] == 0.25
    assert m["rollout/response_len/mean"] == 3.0 and m["rollout/response_len/median"] == 3.0
    assert (m["rollout/response_len/max"], m["rollout/response_len/min"]) == (4.0, 2.0)
    assert m["rollout/zero_std/count_0.0"] == 1.0 and m["rollout/zero_std/count_1.0"] == 0.0
    assert m["passrate/pass@2"] == 0.5
