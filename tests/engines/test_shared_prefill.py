"""Rows that have read the same tokens share one cache row and one row of each forward: a prefill
group's equal prompts (a GRPO group's samples) run once, and so do their decode steps while they
feed the same tokens; once they part ways each row decodes as if it had run alone from the start."""
from __future__ import annotations

import torch

from miles.engines.model_runner import _distinct
from tests.support.in_process_engine import prompt


def test_distinct_rows_keep_first_seen_order():
    assert _distinct([[1, 2], [3], [1, 2], [3], [4]]) == ([[1, 2], [3], [4]], [0, 1, 0, 1, 2])


def rows_run_by(runner) -> tuple[list[int], object]:
    """The batch size of each forward of the runner's model, and the hook to remove."""
    seen: list[int] = []
    hook = runner.model.register_forward_pre_hook(
        lambda _m, _args, kwargs: seen.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    return seen, hook


def alone_logits(runner, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return runner.model(input_ids=torch.tensor([ids])).logits[0, -1]


def test_equal_rows_run_once_and_each_row_reads_as_alone(runner):
    a, b, c = (prompt(runner, t) for t in ("what is 12+13? 12+13=", "1+2=", "37+58="))
    read = [list(p) for p in (a, a, b, a, c, b)]
    steps = [[5, 5, 7, 6, 9, 7],  # rows 0 and 1 (a) and 2 and 5 (b) feed the same token: shared
             [3, 4, 8, 8, 8, 9]]  # now every row feeds its own: all six part ways
    seen, hook = rows_run_by(runner)
    try:
        logits, state = runner.prefill(read)
        got = [logits]
        for tokens in steps:
            got.append(runner.decode(tokens, state))
            for row, token in zip(read, tokens):
                row.append(token)
        state.keep_rows([5, 0, 3])  # rows leave; the rest keep their own cache rows
        got.append(runner.decode([1, 1, 1], state))
    finally:
        hook.remove()
    assert seen == [3, 4, 6, 3]  # distinct prompts; distinct (history, token) pairs
    for i, row in enumerate(read):
        for step, logits in enumerate(got[:3]):
            expected = alone_logits(runner, row[:len(row) - 2 + step])
            assert torch.allclose(logits[i], expected, atol=1e-5), f"row {i} step {step}"
    for i, row in enumerate(read[j] for j in (5, 0, 3)):
        expected = alone_logits(runner, row + [1])
        assert torch.allclose(got[3][i], expected, atol=1e-5), f"kept row {i}"
