"""Rewards: exact match, math answers with \\boxed{}, custom reward functions by dotted path."""
import sys
import textwrap

import pytest

from miles.config import ConfigError
from miles.rollout.rewards import RewardModel, exact_match, last_boxed, math_reward
from miles.rollout.sample import Sample, Status


def test_exact_match_ignores_surrounding_space_only():
    assert exact_match(" 95\n", "95") == 1.0
    assert exact_match("9 5", "95") == 0.0
    assert exact_match("95", None) == 0.0


def test_last_boxed_handles_nested_braces_and_cut_off_answers():
    assert last_boxed(r"so \boxed{1} or rather \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{12") is None
    assert last_boxed("no box") is None


@pytest.mark.parametrize("response,label,expected", [
    (r"The answer is \boxed{42}.", "42", 1.0),
    (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
    (r"\boxed{1,000}", "1000", 1.0),
    (r"\boxed{41}", "42", 0.0),
    ("so it is 7 then 42", "42", 1.0),  # no box: the last number counts
    ("no number", "42", 0.0),
    (r"\boxed{x+1}", r"\boxed{x + 1}", 1.0),
])
def test_math_reward(response, label, expected):
    assert math_reward(response, label) == expected


def _samples():
    return [Sample(index=0, group_index=0, prompt="1+1=", label="2", response="2"),
            Sample(index=1, group_index=0, prompt="1+1=", label="2", response="3"),
            Sample(index=2, group_index=0, prompt="1+1=", label="2", response="2", status=Status.ABORTED)]


def test_reward_model_scores_and_zeroes_aborted_samples():
    samples = _samples()
    RewardModel("exact_match", None, args=None).score(samples)
    assert [s.raw_reward for s in samples] == [1.0, 0.0, 0.0]
    assert [s.reward for s in samples] == [1.0, 0.0, 0.0]


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent("""
        async def length_reward(args, sample):
            return len(sample.response) * args.scale

        def dict_reward(args, sample):
            return {"reward": 0.5, "note": "x"}

        def one_arg(sample):
            return 1.0
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards"
    sys.modules.pop("my_rewards", None)


def test_custom_reward_async_and_dict_results(plugin_module):
    class Args:
        scale = 2.0

    samples = _samples()[:2]
    RewardModel("exact_match", f"{plugin_module}.length_reward", Args()).score(samples)
    assert [s.reward for s in samples] == [2.0, 2.0]
    RewardModel("exact_match", f"{plugin_module}.dict_reward", Args()).score(samples)
    assert [s.reward for s in samples] == [0.5, 0.5]


@pytest.mark.parametrize("path,fragment", [
    ("nodots", "not a dotted path"),
    ("no_such_module_xyz.fn", "cannot import module"),
    ("my_rewards.missing", "has no function 'missing'"),
    ("my_rewards.one_arg", "must accept 2 positional arguments"),
])
def test_custom_reward_errors_name_the_flag(plugin_module, path, fragment):
    with pytest.raises(ConfigError) as err:
        RewardModel("exact_match", path, None)
    assert err.value.flag == "--custom-rm-path" and fragment in str(err.value)
