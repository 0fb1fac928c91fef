"""The learning-rate schedule: linear warm-up, then constant, linear or cosine decay to min-lr."""
from __future__ import annotations

import math


def lr_at(step: int, *, lr: float, min_lr: float, warmup: int, decay_style: str, decay_steps: int) -> float:
    """LR of optimizer step `step` (0-based), Megatron-style: warm-up ramps from lr/warmup to lr."""
    if warmup and step < warmup:
        return lr * (step + 1) / warmup
    if decay_style == "constant":
        return lr
    span = max(1, decay_steps - warmup)
    progress = min(1.0, (step - warmup) / span)
    if decay_style == "linear":
        return min_lr + (lr - min_lr) * (1.0 - progress)
    if decay_style == "cosine":
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown --lr-decay-style {decay_style!r}")
