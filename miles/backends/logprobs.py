"""Per-token log-probs and entropy of the sampled tokens, from logits divided by the rollout temperature.

Backend-free: each backend runs its own forward and hands the (B, T, V) logits here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TokenStats:
    log_probs: torch.Tensor  # (B, T-1) log p(token t+1 | prefix) at temperature T
    entropy: torch.Tensor  # (B, T-1) entropy of the whole next-token distribution


def stats_from_logits(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float) -> TokenStats:
    """The engine samples from softmax(logits / T); scoring with the same T keeps the
    train and rollout log-probs comparable (Miles' train_rollout_logprob_abs_diff)."""
    logits = logits[:, :-1].float()  # (B, T-1, V): position t predicts token t+1
    if temperature > 0:
        logits = logits / temperature
    log_p = torch.log_softmax(logits, dim=-1)
    chosen = log_p.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    return TokenStats(chosen, entropy)
