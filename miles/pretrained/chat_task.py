"""A verifiable chat task for a small instruct model: one-step arithmetic, answered in `\\boxed{}`.

Each line is {"prompt": "What is 7 + 5? Put the final answer in \\boxed{}.", "label": "12"}; with
`--apply-chat-template` the prompt becomes the user turn, and `--rm-type math` reads the last
`\\boxed{}` of the response (else its last number). Small operands keep the task within reach of a
135M model, so sampling at temperature 1 is right sometimes and GRPO has a signal from the first rollout.
Train and eval sets are disjoint and fixed by the seed.
"""
from __future__ import annotations

from pathlib import Path

from miles.tiny.task import Problem, held_out, write_splits

MAX_OPERAND = 20
EVAL_SIZE = 64
TEMPLATE = "What is {a} {op} {b}? Put the final answer in \\boxed{{}}."


def all_problems() -> list[Problem]:
    out = []
    for a in range(1, MAX_OPERAND + 1):
        for b in range(1, MAX_OPERAND + 1):
            out.append(Problem(TEMPLATE.format(a=a, op="+", b=b), str(a + b)))
            if a >= b:
                out.append(Problem(TEMPLATE.format(a=a, op="-", b=b), str(a - b)))
    return out


def write_chat_task(directory: Path, seed: int = 0) -> tuple[Path, Path]:
    """(train.jsonl, eval.jsonl) under `directory`, written when missing (milliseconds)."""
    return write_splits(directory, *held_out(all_problems(), seed, EVAL_SIZE))
