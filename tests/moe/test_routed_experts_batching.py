"""A sample's routing record through the trainer's batching (rank split, micro-batch padding), kept
out of the sample tables, and the replay flag refused where it cannot replay."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from miles.backends.batch import micro_batches
from miles.backends.pack import split_for_ranks
from miles.config import parse_config
from miles.config.fields import ConfigError
from miles.engines.routing_capture import encode
from miles.moe.replay import RoutingReplay, require_records, require_routers
from miles.record.samples import sample_row
from miles.rollout.sample import Sample


def sample(i: int, prompt_len: int, response_len: int, record: bool = True) -> Sample:
    tokens = list(range(10, 10 + prompt_len + response_len))
    routed = np.full((len(tokens) - 1, 2, 2), i % 4, dtype=np.int8) if record else None
    return Sample(index=i, group_index=i // 2, prompt="p", label=None, tokens=tokens,
                  response_length=response_len, rollout_log_probs=[-1.0] * response_len,
                  routed_experts=routed)


def test_records_reach_each_micro_batch_right_padded_with_no_choice():
    samples = [sample(i, 3 + i, 2 + (i % 3)) for i in range(8)]
    batches = split_for_ranks(samples, [0.5] * 8, 8, 2, rollout_id=0)
    assert [b.routed_experts[0][0, 0, 0] for b in batches] == [0, 0]  # samples 0 and 4
    mb = micro_batches(batches[1], 4, 0, torch.device("cpu"))[0]
    width = mb.input_ids.shape[1]
    assert mb.routed_experts.shape == (4, width, 2, 2) and mb.routed_experts.dtype == torch.int8
    for r, i in enumerate(range(4, 8)):
        n = len(samples[i].tokens) - 1  # read tokens: all but the last
        assert (mb.routed_experts[r, :n] == i % 4).all()
        assert (mb.routed_experts[r, n:] == -1).all()  # the last token and the padding: no choice


def test_a_model_parallel_replica_pools_its_members_records_with_their_samples():
    """Megatron's TP x PP members pool their slices (replica_batch): each record stays with its
    sample; members handed the same batch (split by replica) compare their records as arrays."""
    from miles.backends.megatron import replica_batch

    samples = [sample(i, 3 + i, 2 + (i % 3)) for i in range(8)]
    whole = split_for_ranks(samples, [0.5] * 8, 4, 1, rollout_id=0)[0]  # 2 steps of 4
    pooled = replica_batch.merge(split_for_ranks(samples, [0.5] * 8, 4, 2, rollout_id=0))
    assert pooled.sample_indices == whole.sample_indices
    assert all(np.array_equal(samples[i].routed_experts, r)
               for i, r in zip(pooled.sample_indices, pooled.routed_experts))
    copy = split_for_ranks(samples, [0.5] * 8, 4, 1, rollout_id=0)[0]  # equal, not the same
    assert replica_batch.merge([whole, copy]) is whole


def test_a_batch_with_a_sample_missing_its_record_carries_none():
    samples = [sample(0, 3, 2), sample(1, 3, 2, record=False)]
    batch = split_for_ranks(samples, [0.0, 0.0], 2, 1, rollout_id=0)[0]
    assert batch.routed_experts is None
    assert micro_batches(batch, 2, 0, torch.device("cpu"))[0].routed_experts is None


def test_the_sample_table_leaves_the_record_out():
    assert not any("routed" in key for key in sample_row(0, sample(0, 3, 2)))


def test_the_replay_flag_is_taken_with_pipeline_stages():
    cfg = parse_config(["--use-rollout-routing-replay", "--train-backend", "megatron",
                        "--actor-num-gpus-per-node", "2", "--pipeline-model-parallel-size", "2"])
    assert cfg.train.use_rollout_routing_replay and cfg.train.pipeline_model_parallel_size == 2


@pytest.mark.parametrize("argv,fragment", [
    (["--use-rollout-routing-replay", "--no-record-routed-experts"], "--no-record-routed-experts"),
])
def test_the_replay_flag_is_refused_where_it_cannot_replay(argv, fragment):
    parse_config([*argv[1:], "--no-use-rollout-routing-replay"])  # the rest of the layout is valid
    with pytest.raises(ConfigError, match="--use-rollout-routing-replay") as err:
        parse_config(argv)
    assert fragment in str(err.value)


def test_a_dense_policy_refuses_replay():
    from miles.tiny.model import build_tiny_model

    model, _ = build_tiny_model(0)
    assert RoutingReplay.attach(model) is None
    with pytest.raises(ValueError, match="--use-rollout-routing-replay: the policy dense/ has no "):
        require_routers(None, True, "dense/")
    require_routers(None, False, "dense/")  # without the flag a dense policy trains as before


def test_replay_without_the_engines_records_is_refused():
    """An engine that did not return them (SGLang without its server flag) or a custom generate
    function that did not fill them: the run stops instead of training on its own routing."""
    with pytest.raises(ValueError, match="carry no routed experts.*--enable-return-routed-experts"):
        require_records(True, True, False)
    require_records(True, False, False)  # a dense policy: nothing to replay (refused at load)
    require_records(False, True, False)  # no replay asked: the run trains as before, no metric
    require_records(True, True, True)


class ScriptedEngine:
    """A /generate client answering each turn from a script: the answer's tokens and a record of the
    tokens that call read, each row holding the turn number (which call routed it)."""

    def __init__(self, answers: list[list[int]]):
        self.answers, self.bodies = answers, []

    async def post(self, path, payload, headers=None):
        turn = len(self.bodies)
        self.bodies.append(payload)
        ids = self.answers[turn]
        read = len(payload["input_ids"]) + len(ids) - 1
        meta = {"output_token_logprobs": [[-0.5, t, None] for t in ids],
                "finish_reason": {"type": "stop"}, "weight_version": "1",
                **encode(np.full((read, 2, 2), turn, dtype=np.int8))}
        return 200, json.dumps({"text": "", "output_ids": ids, "meta_info": meta}).encode()


def test_a_multi_turn_sample_keeps_each_answer_routed_as_its_own_call_routed_it():
    """Turn 1 calls the calculator, turn 2 answers; the second call prefills the whole conversation
    again. The sample's record is the last call's, but the positions that predict turn 1's answer
    keep turn 1's routing: what sampled those tokens."""
    from miles.rollout.generate import GenerateFnInput, GenerateState
    from miles.rollout.multi_turn import generate
    from miles.tiny.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(tool_markers=True)  # the tool model's: <tool_call> is one token
    ids = lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    answers = [ids("<tool_call>calc 2+3</tool_call>"), ids("5")]
    engine = ScriptedEngine(answers)
    args = SimpleNamespace(generate_tool_specs_path="miles.tiny.calculator.TOOL_SPECS",
                           generate_tool_call_parser="tiny", generate_max_turns=4,
                           generate_tool_timeout=5.0,
                           generate_execute_tool_function_path="miles.tiny.calculator.execute_tool")
    state = GenerateState("http://scripted", tokenizer, args, engine, asyncio.Semaphore(1), (2, 2))
    prompt = ids("2+3=")
    start = Sample(index=0, group_index=0, prompt="2+3=", label="5", tokens=list(prompt))
    done = asyncio.run(generate(GenerateFnInput(state, start, {"seed": 1, "max_new_tokens": 40},
                                                False)))
    assert all(body["return_routed_experts"] for body in engine.bodies) and len(engine.bodies) == 2
    record = done.routed_experts
    assert record.shape == (len(done.tokens) - 1, 2, 2)
    first = slice(len(prompt) - 1, len(prompt) - 1 + len(answers[0]))  # predict turn 1's answer
    assert (record[first] == 0).all()
    rest = np.ones(len(record), dtype=bool)
    rest[first] = False
    assert (record[rest] == 1).all()  # the prompt, the observation and the last answer: call 2's
