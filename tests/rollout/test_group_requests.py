"""The built-in rollout sends one batched /generate per prompt; every sample still gets exactly what its
own request would (per-sample seeds), checked against the one-request-per-sample path on a live engine."""
from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from miles.config import EngineConfig
from miles.engines.launch import launch_engine
from miles.rollout.data import Prompt
from miles.rollout.generate import RolloutSampling, generate, generate_groups


@pytest.fixture(scope="module")
def engine(base_model, tmp_path_factory):
    with launch_engine(base_model, EngineConfig(engine_device="cpu", engine_max_batch_size=16),
                       log_path=tmp_path_factory.mktemp("engine") / "engine.log") as handle:
        yield handle


async def one_request_per_sample(input):  # a "custom" function: the per-sample path
    return await generate(input)


def test_batched_groups_match_one_request_per_sample(engine, base_model):
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    prompts = [Prompt(prompt=f"{a}+{b}=", label=str(a + b)) for a, b in ((1, 2), (37, 58), (5, 9), (12, 13))]
    params = RolloutSampling(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=6)
    common = dict(seed=7, stream="train", rollout_id=3, concurrency=8)
    grouped = generate_groups(engine.url, prompts, 5, tokenizer, params, **common)
    single = generate_groups(engine.url, prompts, 5, tokenizer, params, generate_fn=one_request_per_sample, **common)
    assert [s.index for s in grouped] == list(range(20)) == [s.index for s in single]
    assert [s.group_index for s in grouped] == [i // 5 for i in range(20)]
    for g, s in zip(grouped, single):
        assert g.tokens == s.tokens and g.response == s.response and g.status == s.status
        assert max((abs(a - b) for a, b in zip(g.rollout_log_probs, s.rollout_log_probs)), default=0.0) < 1e-4
        assert g.prompt == s.prompt and g.label == s.label
    assert len({tuple(s.tokens) for s in grouped}) > 4  # the samples of a prompt differ: the seeds steer them
