"""The warm starts' one supervised loop (`train_until`) and what both use with it: torch on one
thread while it runs (`one_thread`) and the tokenizer's ids remembered (`token_ids`).

The addition task (miles.tiny.warmstart) and the calculator task (miles.tiny.tool_warmstart) differ
in their batches, their loss and their held-out check; the loop itself (AdamW, the batch generator
seeded by the recipe, the bar or the progress lines, a check every `eval_every` steps that may end
it) is this one. The made models are cached by recipe, so the loop's random draws keep their order:
the same recipe makes the same weights, bit for bit.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import torch

from miles.tiny.progress import ProgressLines, off_terminal


@dataclass(frozen=True)
class Check:
    """What one held-out check found: the line said about it, whether the target is reached (the
    loop ends), and what the bar shows beside the loss until the next check."""

    said: str
    reached: bool
    shown: str = ""


def train_until(model, batch_loss: Callable[[torch.Generator], torch.Tensor],
                check: Callable[[int], Check], recipe: dict, label: str, progress: bool,
                shown: str = "") -> int:
    """Train `model` on `batch_loss(generator)` (a batch drawn with the recipe's generator, and its
    loss) for at most `recipe["max_steps"]` steps, calling `check(step)` every
    `recipe["eval_every"]` steps until one says the target is reached; the last step taken. `label`
    names the bar, `shown` is what the bar shows beside the loss before the first check."""
    from rich.progress import Progress

    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe["lr"], weight_decay=0.0)
    generator = torch.Generator().manual_seed(recipe["seed"])
    step, total = 0, recipe["max_steps"]
    model.train()
    lines = ProgressLines("warm start", total, off_terminal(progress))
    with Progress(disable=not progress, transient=True) as bar:
        job = bar.add_task(label, total=total)
        for step in range(1, total + 1):
            loss = batch_loss(generator)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            said = " ".join(filter(None, (label, f"loss={loss.item():.3f}", shown)))
            bar.update(job, advance=1, description=said)
            lines.tick(step, loss.item())
            if step % recipe["eval_every"] == 0:
                found = check(step)
                lines.say(found.said)
                shown = found.shown
                if found.reached:
                    break
    return step


@contextmanager
def one_thread():
    """torch on one intra-op thread for a warm start: a model this small gains little from more on
    an idle machine (2 threads: ~10% a step), and on busy cores the extra thread spins against the
    other processes (the addition warm start took 445 s instead of ~100 s beside the test suite's
    other worker). The numbers are the same either way (same losses and weights, bit for bit,
    checked over 300 steps)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def token_ids(tokenizer):
    """`text -> list of ids` of `tokenizer`, remembered: a warm start encodes the same few thousand
    strings thousands of times, and the tokenizer's Python wrapper was ~20% of each step."""
    @lru_cache(maxsize=None)
    def ids(text: str) -> tuple[int, ...]:
        return tuple(tokenizer(text)["input_ids"])

    return lambda text: list(ids(text))
