"""The default verifiable task: two-number addition, in Miles' JSONL data format.

Each line is {"prompt": "37+58=", "label": "95"}; the exact-match reward checks the
response against the label. Train and eval sets are disjoint and fixed by the seed.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from miles.record import files

MAX_OPERAND = 99
EVAL_SIZE = 256


@dataclass(frozen=True)
class Problem:
    prompt: str
    label: str


def all_problems() -> list[Problem]:
    return [Problem(f"{a}+{b}=", str(a + b)) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]


def held_out(problems: list[Problem], seed: int, eval_size: int) -> tuple[list[Problem], list[Problem]]:
    """(train, eval) of any task's problems: a seeded shuffle, the last `eval_size` held out."""
    problems = list(problems)
    random.Random(seed).shuffle(problems)
    return problems[:-eval_size], problems[-eval_size:]


def split_problems(seed: int = 0) -> tuple[list[Problem], list[Problem]]:
    """(train, eval) of the addition problems, EVAL_SIZE held out."""
    return held_out(all_problems(), seed, EVAL_SIZE)


def write_jsonl(problems: list[Problem], path: Path, input_key: str = "prompt", label_key: str = "label") -> Path:
    return files.write_jsonl(path, ({input_key: p.prompt, label_key: p.label} for p in problems))


def write_task_data(directory: Path, seed: int = 0) -> tuple[Path, Path]:
    """Write train.jsonl and eval.jsonl into `directory` (if missing); return their paths."""
    return write_splits(directory, *split_problems(seed))


def write_splits(directory: Path, train: list[Problem], evals: list[Problem]) -> tuple[Path, Path]:
    """Write the train and eval problems as train.jsonl and eval.jsonl (each only if missing)."""
    train_path, eval_path = directory / "train.jsonl", directory / "eval.jsonl"
    if not train_path.exists():
        write_jsonl(train, train_path)
    if not eval_path.exists():
        write_jsonl(evals, eval_path)
    return train_path, eval_path
