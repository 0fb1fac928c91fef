"""`multi_turn/` metrics on hand-built trajectories; nothing for a single-turn rollout."""
from __future__ import annotations

import pytest

from miles.rollout.metrics import rollout_metrics
from miles.rollout.multi_turn_metrics import multi_turn_metrics
from miles.rollout.sample import Sample


def trajectory(turns: int, reward: float, obs_tokens: int, model_tokens: int, calls: int, errors: int = 0,
               hit_max: bool = False) -> Sample:
    roles = ["user"] + ["assistant", "tool"] * (turns - 1) + ["assistant"]
    mask = [1] * model_tokens + [0] * obs_tokens
    return Sample(index=0, group_index=0, prompt="p", label="1", response_length=len(mask), loss_mask=mask,
                  reward=reward, raw_reward=reward, turns=[{"role": r, "text": ""} for r in roles],
                  metadata=dict(tool_calls=calls, tool_errors=errors, hit_max_turns=hit_max))


def test_multi_turn_metrics_by_hand():
    samples = [trajectory(2, 1.0, obs_tokens=6, model_tokens=17, calls=1),
               trajectory(1, 0.0, obs_tokens=0, model_tokens=5, calls=0),
               trajectory(3, 0.0, obs_tokens=12, model_tokens=24, calls=2, errors=1, hit_max=True),
               trajectory(2, 0.0, obs_tokens=6, model_tokens=17, calls=1)]
    m = multi_turn_metrics(samples)
    assert m["multi_turn/round_number_mean"] == 2.0
    assert (m["multi_turn/round_number_max"], m["multi_turn/round_number_min"]) == (3.0, 1.0)
    assert m["multi_turn/raw_response_length_mean"] == (23 + 5 + 36 + 23) / 4
    assert m["multi_turn/wo_obs_response_length_mean"] == (17 + 5 + 24 + 17) / 4
    assert m["multi_turn/tool_calls"] == 1.0 and m["multi_turn/tool_errors"] == 0.25
    assert m["multi_turn/tool_use_ratio"] == 0.75 and m["multi_turn/max_turns_ratio"] == 0.25
    assert m["multi_turn/pass_rate_turns_1"] == 0.0
    assert m["multi_turn/pass_rate_turns_2"] == 0.5
    assert m["multi_turn/pass_rate_turns_3"] == 0.0


def test_single_turn_rollouts_have_no_multi_turn_metrics():
    samples = [Sample(index=i, group_index=0, prompt="1+1=", label="2", response="2", response_length=2,
                      reward=float(i), raw_reward=float(i)) for i in range(2)]
    metrics = rollout_metrics(samples, [0.0, 0.0], 2, binary_reward=True)
    assert not [k for k in metrics if k.startswith("multi_turn/")]
    assert samples[0].num_turns == 1 and samples[0].final_text == "2"


def test_reward_reads_the_final_turn():
    sample = trajectory(2, 0.0, 6, 17, 1)
    sample.turns[-1]["text"] = "2146"
    sample.response = "<tool_call>calc 37*58</tool_call><tool_response>2146</tool_response>2146"
    assert sample.final_text == "2146"
    from miles.rollout.rewards import RewardModel

    RewardModel("exact_match", None, None).score([sample])
    assert sample.reward == pytest.approx(0.0)  # label "1"
    sample.label = "2146"
    RewardModel("exact_match", None, None).score([sample])
    assert sample.reward == 1.0
