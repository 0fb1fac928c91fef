"""The warm-started base checkpoint: loadable with plain transformers, and right sometimes but not always."""
from __future__ import annotations

import json

import httpx
from transformers import AutoModelForCausalLM, AutoTokenizer

from miles.tiny.warmstart import default_task_data

CHUNK = 64  # prompts per batched /generate call (the test engine queues at most 64)


def test_transformers_auto_classes_load_it(base_model):
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    model = AutoModelForCausalLM.from_pretrained(base_model)
    assert model.config.architectures == ["Qwen3ForCausalLM"]
    assert tokenizer.eos_token_id == model.config.eos_token_id == 2
    assert tokenizer.decode(tokenizer.encode("37+58=")) == "37+58="


def test_sampled_pass_at_1_through_the_engine(engine):
    _, eval_path = default_task_data()
    problems = [json.loads(line) for line in eval_path.read_text().splitlines()]
    # The RL loop's sampling: temperature 1, no truncation, answer digits then EOS.
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 6}
    correct = 0
    for start in range(0, len(problems), CHUNK):
        chunk = problems[start:start + CHUNK]
        out = httpx.post(engine.url + "/generate", json={"text": [p["prompt"] for p in chunk],
                                                         "sampling_params": params}, timeout=300).json()
        correct += sum(o["text"].strip() == p["label"] for o, p in zip(out, chunk))
    pass_at_1 = correct / len(problems)
    assert len(problems) == 256
    assert 0.10 <= pass_at_1 <= 0.60, pass_at_1
