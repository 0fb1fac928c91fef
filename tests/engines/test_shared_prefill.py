"""A prefill group whose rows share a prompt (a GRPO group's samples) runs each distinct prompt once
and copies its logits and cache to every row holding it; each row then decodes as if prefilled alone."""
from __future__ import annotations

import torch

from miles.engines.model_runner import _distinct
from tests.support.in_process_engine import prompt


def test_distinct_rows_keep_first_seen_order():
    assert _distinct([[1, 2], [3], [1, 2], [3], [4]]) == ([[1, 2], [3], [4]], [0, 1, 0, 1, 2])


def test_equal_prompts_run_once_and_each_row_decodes_as_alone(runner):
    a, b, c = (prompt(runner, t) for t in ("what is 12+13? 12+13=", "1+2=", "37+58="))
    prompts = [a, a, b, a, c, b]
    rows_run: list[int] = []
    hook = runner.model.register_forward_pre_hook(
        lambda _m, _args, kwargs: rows_run.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    try:
        logits, state = runner.prefill(prompts)
        next_tokens = [5, 6, 7, 8, 9, 10]  # each row its own token: the copies part ways
        stepped = runner.decode(next_tokens, state)
    finally:
        hook.remove()
    assert rows_run == [3, 6]  # the prefill ran the 3 distinct prompts; the decode step all 6 rows
    assert logits.shape[0] == stepped.shape[0] == 6
    with torch.no_grad():
        for i, ids in enumerate(prompts):
            alone = runner.model(input_ids=torch.tensor([ids + [next_tokens[i]]])).logits[0]
            assert torch.allclose(logits[i], alone[-2], atol=1e-5), f"row {i} prefill"
            assert torch.allclose(stepped[i], alone[-1], atol=1e-5), f"row {i} decode"
