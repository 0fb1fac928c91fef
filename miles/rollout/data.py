"""Prompt data: a JSONL file read into records and handed out in seeded, resumable batches.

The cursor (epoch, offset) is all the state there is, so a checkpoint that stores it
hands out exactly the same prompts after a resume as an uninterrupted run would.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from miles.record.unicode_text import lone_surrogate_at


@dataclass(frozen=True)
class Prompt:
    prompt: str
    label: str | None


def check_prompt(prompt, where: str, input_key: str, flag: str) -> None:
    """A prompt the engines can take: text that is not empty and encodes as UTF-8 (no lone surrogate),
    or a list/object (chat messages) whose strings encode alike; numbers, booleans and null are refused
    (ConfigError naming `flag`)."""
    from miles.config import ConfigError

    if isinstance(prompt, (list, dict)):
        check_text(prompt, where, input_key, flag)
        return
    if not isinstance(prompt, str):
        raise ConfigError(flag, f"{where}: {input_key!r} is {prompt!r:.40}, not text")
    if not prompt.strip():
        raise ConfigError(flag, f"{where}: {input_key!r} is empty")
    check_text(prompt, where, input_key, flag)


def check_text(value, where: str, key: str, flag: str) -> None:
    """ConfigError naming `flag` when a string in `value` (at any depth) holds a lone surrogate: no UTF-8
    writer takes it, and one in a label made every later metric stay out of MLflow (probe ST1)."""
    from miles.config import ConfigError

    for text in _strings(value):
        at = lone_surrogate_at(text)
        if at is not None:
            raise ConfigError(flag, f"{where}: {key!r} holds a lone surrogate ({text[at]!r} at character {at}), "
                                    f"which is not text")


def _strings(value):
    """Every string in `value`: itself, or the keys and values of its lists and dicts at any depth."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def read_prompts(path: str | Path, input_key: str, label_key: str, flag: str = "--prompt-data") -> list[Prompt]:
    """Every line of a JSONL file as a Prompt; a missing key or bad line names the file and line."""
    from miles.config import ConfigError

    path = Path(path)
    if not path.is_file():
        raise ConfigError(flag, f"file does not exist: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(flag, f"{path} is not UTF-8 text (byte {exc.start}); expected JSONL") from None
    prompts = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(flag, f"{path}:{lineno} is not JSON: {exc}") from None
        if not isinstance(record, dict):
            raise ConfigError(flag, f"{path}:{lineno} is a JSON {type(record).__name__}; each line must be an "
                                    f"object like {{\"{input_key}\": ...}}")
        if input_key not in record:
            raise ConfigError("--input-key", f"{path}:{lineno} has no key {input_key!r} (keys: {sorted(record)})")
        prompt, label = record[input_key], record.get(label_key)
        check_prompt(prompt, f"{path}:{lineno}", input_key, flag)
        check_text(label, f"{path}:{lineno}", label_key, flag)  # a label is text in the samples and tables
        if isinstance(label, (list, dict)):  # str() of it would never equal an answer: reward 0 for every sample
            raise ConfigError(flag, f"{path}:{lineno}: {label_key!r} is a JSON {type(label).__name__}; a label must "
                                    f"be a string or number (or null: no label)")
        prompts.append(Prompt(prompt if isinstance(prompt, str) else str(prompt), None if label is None else str(label)))
    if not prompts:
        raise ConfigError(flag, f"{path} holds no prompts")
    return prompts


class DataSource:
    """Hands out prompts in a fresh seeded order each epoch; state_dict() is the cursor."""

    def __init__(self, prompts: list[Prompt], seed: int, shuffle: bool = True):
        self.prompts = prompts
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.offset = 0

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.prompts)))
        if self.shuffle:
            random.Random(self.seed * 100_003 + epoch).shuffle(order)
        return order

    def next_batch(self, size: int) -> list[Prompt]:
        batch = []
        while len(batch) < size:
            order = self._order(self.epoch)
            take = order[self.offset: self.offset + size - len(batch)]
            batch += [self.prompts[i] for i in take]
            self.offset += len(take)
            if self.offset >= len(order):
                self.epoch, self.offset = self.epoch + 1, 0
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
