"""Request parsing, sampling and detokenizing, checked without a server."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from miles.engines.detokenize import IncrementalText, final_text
from miles.engines.sglang_request import FinishReason, RequestError, SamplingParams, parse_generate, parse_sampling_params
from miles.engines.sampling import RowSampler, choose, scaled_logprobs


def test_sampling_defaults_follow_sglang():
    params = parse_sampling_params(None)
    assert params == SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=128)
    assert parse_sampling_params({"sampling_seed": 5}).seed == 5
    assert parse_sampling_params({"stop": "x"}).stop == ("x",)
    assert parse_sampling_params({"repetition_penalty": 1.0, "n": 1}).max_new_tokens == 128


@pytest.mark.parametrize("raw,field", [({"temperature": -1}, "temperature"), ({"top_k": -2}, "top_k"),
                                       ({"seed": "1"}, "seed"), ({"stop_token_ids": [1, -1]}, "stop_token_ids"),
                                       ({"min_new_tokens": True}, "min_new_tokens"), ({"n": 2}, "n")])
def test_bad_sampling_fields_name_themselves(raw, field):
    with pytest.raises(RequestError) as err:
        parse_sampling_params(raw)
    assert err.value.param == field and err.value.status == 400


def test_batched_call_needs_one_entry_per_prompt():
    with pytest.raises(RequestError, match="2 entries for 3 prompts"):
        parse_generate({"text": ["a", "b", "c"], "sampling_params": [{}, {}]})
    call = parse_generate({"text": ["a", "b"], "rid": ["r1", "r2"], "return_logprob": True})
    assert [i.rid for i in call.items] == ["r1", "r2"] and all(i.return_logprob for i in call.items)
    with pytest.raises(RequestError, match="stream"):
        parse_generate({"text": ["a", "b"], "stream": True})


def test_logprobs_are_temperature_scaled_before_truncation():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    for temperature in (0.5, 1.0, 2.0):
        expected = torch.log_softmax(logits / temperature, dim=-1)
        assert torch.allclose(scaled_logprobs(logits, torch.tensor([temperature])), expected)
    # top_k=1 always picks the argmax, yet reports its log-prob under the full scaled distribution.
    row = RowSampler(SamplingParams(temperature=2.0, top_k=1), torch.Generator().manual_seed(0))
    chosen = choose(logits, [row])
    assert chosen.token_ids == [0]
    assert chosen.logprobs[0] == pytest.approx(torch.log_softmax(logits / 2.0, -1)[0, 0].item())
    greedy = choose(logits, [RowSampler(SamplingParams(temperature=0.0), torch.Generator())])
    assert greedy.logprobs[0] == pytest.approx(torch.log_softmax(logits, -1)[0, 0].item())


def test_top_p_and_banned_tokens():
    logits = torch.tensor([[5.0, 4.9, -5.0, -5.0]])
    for seed in range(20):
        tiny_p = RowSampler(SamplingParams(top_p=0.01), torch.Generator().manual_seed(seed))
        assert choose(logits, [tiny_p]).token_ids == [0]  # only the most likely token survives top-p
        banned = RowSampler(SamplingParams(temperature=0.0), torch.Generator(), banned=(0,))
        assert choose(logits, [banned]).token_ids == [1]


def test_same_generator_seed_same_draws_in_any_row():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    alone = [choose(logits[1:2], [RowSampler(SamplingParams(), torch.Generator().manual_seed(7))]).token_ids[0]
             for _ in range(3)]
    rows = [RowSampler(SamplingParams(), torch.Generator().manual_seed(s)) for s in (1, 7, 2)]
    batched = choose(logits, rows).token_ids[1]
    assert alone == [batched] * 3


def test_text_trimming_and_streaming_deltas(base_model):
    tok = AutoTokenizer.from_pretrained(base_model)
    ids = tok.encode("95") + [tok.eos_token_id]
    params = SamplingParams()
    assert final_text(tok, ids, params, FinishReason("stop", matched=tok.eos_token_id)) == "95"
    stop = SamplingParams(stop=("5",))
    assert final_text(tok, tok.encode("9512"), stop, FinishReason("stop", matched="5")) == "9"
    stream = IncrementalText(tok, SamplingParams(stop=("ab",)))
    deltas = [stream.update(tok.encode("xya"[: n + 1])) for n in range(3)]
    assert deltas == ["", "x", "y"]  # "a" is held back: it may begin the stop string "ab"
    assert stream.finish(tok.encode("xyab"), FinishReason("stop", matched="ab")) == ""
    assert stream.sent == "xy"


def test_whole_distribution_rows_follow_the_softmax_and_never_draw_a_banned_token():
    """The batched inverse-CDF draw (rows with top_p 1 and no top_k) samples softmax(logits / T); a banned
    token (EOS before min_new_tokens) is never drawn. Seeded, so the counts are the same every run. 20,000
    draws of each kind, as batches of 2,000 rows with free and banned rows interleaved (one call per row pair
    drew the same counts in 40 s instead of 1)."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -3.0]])
    draws, rows_per_batch = 20_000, 1_000
    for temperature in (1.0, 0.7):
        free, banned = RowSampler(SamplingParams(temperature=temperature), torch.Generator().manual_seed(3)), \
            RowSampler(SamplingParams(temperature=temperature), torch.Generator().manual_seed(4), banned=(0, 2))
        counts, banned_counts = torch.zeros(5), torch.zeros(5)
        for _ in range(draws // rows_per_batch):
            picks = choose(logits.expand(2 * rows_per_batch, -1), [free, banned] * rows_per_batch).token_ids
            counts += torch.bincount(torch.tensor(picks[0::2]), minlength=5)
            banned_counts += torch.bincount(torch.tensor(picks[1::2]), minlength=5)
        assert counts.sum() == banned_counts.sum() == draws
        expected = torch.softmax(logits[0] / temperature, -1)
        assert torch.allclose(counts / counts.sum(), expected, atol=0.01)
        assert banned_counts[0] == banned_counts[2] == 0
        rest = expected.clone()
        rest[[0, 2]] = 0
        assert torch.allclose(banned_counts / banned_counts.sum(), rest / rest.sum(), atol=0.015)
