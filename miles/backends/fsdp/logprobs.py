"""Token log-probs and entropy from the HF model's forward (the math is `miles.backends.logprobs`);
for a mixture-of-experts model in a pass that trains, its routers' load-balancing loss beside
them."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from miles.backends.fsdp.load_balancing import is_moe, load_balancing_loss
from miles.backends.logprobs import TokenStats, stats_from_logits

__all__ = ["TokenStats", "RoutedTokenStats", "token_stats"]


@dataclass
class RoutedTokenStats(TokenStats):
    """The stats of a MoE forward that keeps gradients: and the load-balancing loss summed over its
    MoE layers (`load_balancing.load_balancing_loss`), which the training objective adds."""

    load_balancing_loss: torch.Tensor | None = None


def token_stats(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                temperature: float) -> TokenStats:
    routed = is_moe(model) and torch.is_grad_enabled()  # the log-prob passes need no router loss
    extra = {"output_router_logits": True} if routed else {}
    out = model(input_ids=input_ids, attention_mask=attention_mask, **extra)
    stats = stats_from_logits(out.logits, input_ids, temperature)  # (B, T, V) logits
    if not routed:
        return stats
    aux = load_balancing_loss(out.router_logits, model.config.num_experts_per_tok)
    return RoutedTokenStats(stats.log_probs, stats.entropy, aux)
