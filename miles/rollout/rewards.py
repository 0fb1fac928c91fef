"""Reward functions: exact match, math answers with `\\boxed{}`, or a custom `fn(args, sample)`."""
from __future__ import annotations

import asyncio
import inspect
import math
import re
from typing import Any, Callable

from miles.rollout.plugins import load_function
from miles.rollout.sample import Sample

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def exact_match(response: str, label: str | None) -> float:
    return float(label is not None and response.strip() == label.strip())


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}`, braces balanced, or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1: j]
    return None  # unbalanced: the answer was cut off


def normalize_answer(text: str) -> str:
    text = text.strip().strip("$").replace(" ", "").replace(",", "")
    text = re.sub(r"\\(?:text|mathrm)\{([^}]*)\}", r"\1", text)
    text = text.replace("\\left", "").replace("\\right", "").replace("\\!", "")
    text = re.sub(r"\\[dt]?frac\{([^}]*)\}\{([^}]*)\}", r"\1/\2", text)
    return text.rstrip(".")


def _as_number(text: str) -> float | None:
    try:
        if "/" in text:
            num, den = text.split("/", 1)
            return float(num) / float(den)
        return float(text)
    except (ValueError, ZeroDivisionError):
        return None


def math_reward(response: str, label: str | None) -> float:
    """1.0 when the boxed answer (else the last number) equals the label, numerically or as text."""
    if label is None:
        return 0.0
    answer = last_boxed(response)
    if answer is None:
        numbers = NUMBER.findall(response)
        if not numbers:
            return 0.0
        answer = numbers[-1]
    ref = last_boxed(label) or label
    got, want = normalize_answer(answer), normalize_answer(ref)
    if got == want:
        return 1.0
    a, b = _as_number(got), _as_number(want)
    return float(a is not None and b is not None and abs(a - b) <= 1e-6 * max(1.0, abs(b)))


BUILTIN = {"exact_match": exact_match, "math": math_reward}


def checked_reward(value: Any, path: str) -> float:
    """A custom reward as a finite float; anything else stops the run with an error naming the hook
    (a NaN reward would otherwise train on NaN and save a NaN checkpoint)."""
    from miles.config import ConfigError

    number = None
    if not isinstance(value, (str, bytes)):  # float("1.0") would pass a string through
        try:
            number = float(value)
        except (TypeError, ValueError):
            pass
    if number is None:
        raise ConfigError("--custom-rm-path", f"{path} returned {value!r} ({type(value).__name__}); a reward must be "
                                              "a number (or a dict with a numeric \"reward\")")
    if not math.isfinite(number):
        raise ConfigError("--custom-rm-path", f"{path} returned {value!r}; a reward must be a finite number")
    return number


class RewardModel:
    """Scores samples with the configured reward (`--custom-rm-path` wins over `--rm-type`)."""

    def __init__(self, rm_type: str, custom_rm_path: str | None, args: Any):
        self.args = args
        self.custom_rm_path = custom_rm_path
        self.custom: Callable | None = None
        if custom_rm_path:
            self.custom = load_function(custom_rm_path, "--custom-rm-path", 2)
        elif rm_type not in BUILTIN:
            from miles.config import ConfigError

            raise ConfigError("--rm-type", f"unknown reward {rm_type!r}; choose one of {sorted(BUILTIN)}")
        self.builtin = BUILTIN.get(rm_type)

    async def _score(self, sample: Sample) -> float:
        if self.custom is None:
            return self.builtin(sample.final_text, sample.label)
        value = self.custom(self.args, sample)
        if inspect.isawaitable(value):
            value = await value
        if isinstance(value, dict):  # Miles allows dict rewards; the "reward" key is the score
            value = value.get("reward")
        return checked_reward(value, self.custom_rm_path)

    def score(self, samples: list[Sample]) -> None:
        """Set `raw_reward` and `reward` on every sample (aborted samples score 0)."""
        async def run():
            return await asyncio.gather(*(self._score(s) for s in samples))

        for sample, value in zip(samples, asyncio.run(run())):
            sample.raw_reward = value if sample.status.value != "aborted" else 0.0
            sample.reward = sample.raw_reward
