"""Token log-probs and entropy from the HF model's forward (the math is `miles.backends.logprobs`)."""
from __future__ import annotations

import torch

from miles.backends.logprobs import TokenStats, stats_from_logits

__all__ = ["TokenStats", "token_stats"]


def token_stats(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float) -> TokenStats:
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, T, V)
    return stats_from_logits(logits, input_ids, temperature)
