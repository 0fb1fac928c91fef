"""The engine serves its weights faithfully: log-probs match a plain forward pass, seeds are batch-independent."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.support.engines import post_while_paused

# Prompts of different lengths, so the batch is left-padded differently for each row.
PROMPTS = ["1+2=", "37+58=", "hello 99+1=", "7+", "what is 12+13? 12+13="]


@pytest.fixture(scope="module")
def tokenizer(base_model):
    return AutoTokenizer.from_pretrained(base_model)


@pytest.fixture(scope="module")
def reference(base_model):
    return AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32).eval()


def forward_logprobs(model, prompt_ids: list[int], output_ids: list[int], temperature: float) -> list[float]:
    """log_softmax(logits / T) of each output token, from one unbatched forward pass."""
    ids = torch.tensor([prompt_ids + output_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    scale = temperature if temperature > 0 else 1.0
    logprobs = torch.log_softmax(logits / scale, dim=-1)
    start = len(prompt_ids) - 1  # logits at position t predict token t + 1
    return [logprobs[start + i, tok].item() for i, tok in enumerate(output_ids)]


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_logprobs_match_a_forward_pass_in_a_mixed_batch(engine, reference, tokenizer, temperature):
    bodies = [{"text": p, "return_logprob": True,
               "sampling_params": {"temperature": temperature, "max_new_tokens": 12, "ignore_eos": i % 2 == 0}}
              for i, p in enumerate(PROMPTS)]
    responses = post_while_paused(engine.url, "/generate", bodies)  # all five decoded as one batch
    worst = 0.0
    for body, response in zip(bodies, responses):
        out = response.json()
        served = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
        prompt_ids = tokenizer.encode(body["text"])
        assert len(prompt_ids) == out["meta_info"]["prompt_tokens"]
        expected = forward_logprobs(reference, prompt_ids, out["output_ids"], temperature)
        worst = max(worst, max(abs(a - b) for a, b in zip(served, expected)))
        assert len(served) == len(out["output_ids"]) == out["meta_info"]["completion_tokens"]
    assert worst < 1e-4, f"largest log-prob difference {worst}"


def test_seeded_request_is_the_same_alone_or_in_a_batch(engine, client):
    seeded = {"text": "23+45=", "sampling_params": {"temperature": 1.0, "max_new_tokens": 10, "ignore_eos": True,
                                                    "seed": 1234}}
    alone = client.post("/generate", json=seeded).json()
    others = [{"text": f"{i}{i}+{i}=", "sampling_params": {"temperature": 1.0, "max_new_tokens": 4 + i}}
              for i in range(6)]
    batched = post_while_paused(engine.url, "/generate", [*others[:3], seeded, *others[3:]])[3].json()
    again = client.post("/generate", json=seeded).json()
    assert alone["output_ids"] == batched["output_ids"] == again["output_ids"]
    others_seeds = {tuple(client.post("/generate", json={**seeded, "sampling_params": {
        **seeded["sampling_params"], "seed": seed}}).json()["output_ids"]) for seed in (1, 2, 3, 4)}
    assert len(others_seeds | {tuple(alone["output_ids"])}) > 1  # the seed does steer the sampling
