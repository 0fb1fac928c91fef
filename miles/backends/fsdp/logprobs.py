"""Per-token log-probs and entropy of the sampled tokens, from logits divided by the rollout temperature."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TokenStats:
    log_probs: torch.Tensor  # (B, T-1) log p(token t+1 | prefix) at temperature T
    entropy: torch.Tensor  # (B, T-1) entropy of the whole next-token distribution


def token_stats(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float) -> TokenStats:
    """The engine samples from softmax(logits / T); scoring with the same T keeps the
    train and rollout log-probs comparable (Miles' train_rollout_logprob_abs_diff)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    if temperature > 0:
        logits = logits / temperature
    log_p = torch.log_softmax(logits, dim=-1)  # (B, T-1, V)
    chosen = log_p.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    return TokenStats(chosen, entropy)
