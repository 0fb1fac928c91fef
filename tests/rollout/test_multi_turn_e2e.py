"""Multi-turn rollouts through the real router and two embedded engines: every turn of a trajectory on
one engine, and a trajectory whose engine dies between turns finishes on the other."""
from __future__ import annotations

import argparse
import json

import httpx
import pytest
from transformers import AutoTokenizer

from miles.config import EngineConfig, GenerateConfig, RouterConfig
from miles.engines.launch import launch_engine
from miles.rollout import multi_turn
from miles.rollout.data import Prompt
from miles.rollout.generate import RolloutSampling, generate_groups
from miles.rollout.rewards import RewardModel
from miles.router import start_router
from tests.rollout import affinity_tools

pytestmark = pytest.mark.slow

TOOLS = dict(custom_generate_function_path="miles.rollout.multi_turn.generate", generate_max_turns=3,
             generate_tool_specs_path="miles.tiny.calculator.TOOL_SPECS", generate_tool_call_parser="tiny",
             generate_execute_tool_function_path="miles.tiny.calculator.execute_tool")
PROMPTS = [Prompt(f"{a}*{b}=", str(a * b)) for a, b in ((37, 58), (12, 34), (99, 11), (45, 67))]
# The warm-started policy calls the tool in about a quarter of its samples: sampling up to
# MAX_TRIES trajectories finds WANTED that do (all but certain: P(fewer) < 1e-3).
WANTED, MAX_TRIES = 3, 48
CALL_BATCHES = 8  # of 32 samples, for the OpenAI client's first tool call


@pytest.fixture(scope="module")
def tool_model():
    from miles.tiny.tool_warmstart import ensure_tool_model

    return ensure_tool_model(progress=False)


@pytest.fixture(scope="module")
def engines(tool_model, tmp_path_factory):
    config = EngineConfig(engine_device="cpu", engine_max_batch_size=8, tool_call_parser="tiny")
    handles = [launch_engine(tool_model, config, log_path=tmp_path_factory.mktemp("engine") / f"engine{i}.log")
               for i in range(2)]
    yield handles
    for handle in handles:
        handle.stop()


def rollout(router_url: str, tokenizer, prompt: Prompt, attempt: int, **fields):
    """One trajectory, sampled at temperature 1 with a seed of its own."""
    args = argparse.Namespace(**vars(GenerateConfig(**{**TOOLS, **fields})))
    samples = generate_groups(router_url, [prompt], 1, tokenizer, RolloutSampling(1.0, 1.0, -1, 32), seed=0,
                              stream="train", rollout_id=attempt, concurrency=4, generate_fn=multi_turn.generate,
                              args=args)
    RewardModel("exact_match", None, None).score(samples)
    return samples[0]


def json_or_none(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def test_an_openai_client_drives_the_calculator_conversation(engines):
    import openai

    from miles.tiny.calculator import TOOL_SPECS

    with openai.OpenAI(base_url=engines[0].url + "/v1", api_key="unused", timeout=120) as client:
        question = [{"role": "user", "content": "37*58="}]
        # The warm-started policy calls the tool in some of its samples, and at temperature 1 garbles some of
        # those calls ("calccca*83"; in one run a batch of 32 held one call, garbled): batches of 32 samples,
        # up to CALL_BATCHES, until one calls the tool as trained; every call on the way parsed into the
        # client's shape.
        called, wanted = [], []
        for _ in range(CALL_BATCHES):
            first = client.chat.completions.create(model="tiny", messages=question, tools=TOOL_SPECS, n=32,
                                                   temperature=1.0, max_tokens=16)
            calls = [c for c in first.choices if c.finish_reason == "tool_calls"]
            assert all(c.message.tool_calls and c.message.tool_calls[0].function.name for c in calls)
            batch = [(c.message.tool_calls[0].function.name, c.message.tool_calls[0].function.arguments) for c in calls]
            called += batch
            wanted = [c for c, (name, arguments) in zip(calls, batch)
                      if name == "calc" and json_or_none(arguments) == {"expression": "37*58"}]
            if wanted:
                break
        assert wanted, called
        call = wanted[0].message.tool_calls[0]
        answer = client.chat.completions.create(
            model="tiny", tools=TOOL_SPECS, temperature=0.0, max_tokens=8,
            messages=[*question, wanted[0].message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": "2146"}])
    assert answer.choices[0].message.content == "2146" and not answer.choices[0].message.tool_calls


def test_every_turn_of_a_trajectory_hits_one_engine(engines, tool_model):
    tokenizer = AutoTokenizer.from_pretrained(str(tool_model))
    router = start_router(RouterConfig(), worker_urls=[e.url for e in engines])
    try:
        with_tool = 0
        for attempt in range(MAX_TRIES):
            prompt = PROMPTS[attempt % len(PROMPTS)]
            before = affinity_tools.requests_per_worker(router.url)
            sample = rollout(router.url, tokenizer, prompt, attempt)
            after = affinity_tools.requests_per_worker(router.url)
            grew = {url: after[url] - before.get(url, 0) for url in after if after[url] > before.get(url, 0)}
            assert list(grew.values()) == [sample.num_turns], f"{sample.num_turns} turns went to {grew}"
            if sample.metadata["tool_calls"]:
                with_tool += 1
                assert [t["role"] for t in sample.turns] == ["user", "assistant", "tool", "assistant"], sample.turns
                observation = tokenizer(f"<tool_response>{sample.turns[2]['text']}</tool_response>")["input_ids"]
                assert sample.loss_mask.count(0) == len(observation)
            if with_tool == WANTED:
                break
        assert with_tool == WANTED, f"only {with_tool} of {attempt + 1} trajectories called the tool"
    finally:
        router.stop()


def test_a_trajectory_whose_engine_dies_finishes_on_the_other(engines, tool_model):
    tokenizer = AutoTokenizer.from_pretrained(str(tool_model))
    router = start_router(RouterConfig(disable_rollout_health_check=True), worker_urls=[e.url for e in engines])
    try:
        affinity_tools.ROUTER_URL = router.url
        affinity_tools.ENGINES = {e.url: e for e in engines}
        for attempt in range(MAX_TRIES):  # until a trajectory calls the tool (which kills its engine)
            affinity_tools.BEFORE = affinity_tools.requests_per_worker(router.url)
            sample = rollout(router.url, tokenizer, PROMPTS[0], attempt,
                             generate_execute_tool_function_path="tests.rollout.affinity_tools.kill_serving_engine")
            if affinity_tools.KILLED:
                break
        killed = affinity_tools.KILLED[0]
        after = affinity_tools.requests_per_worker(router.url)
        (survivor,) = [e.url for e in engines if e.url != killed]
        assert not affinity_tools.ENGINES[killed].alive
        assert after[survivor] - affinity_tools.BEFORE[survivor] == 1  # the second turn
        assert sample.num_turns == 2 and sample.status.value == "completed", sample.turns
        assert httpx.get(f"{survivor}/health", timeout=10).status_code == 200
    finally:
        router.stop()
