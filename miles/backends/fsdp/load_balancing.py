"""The router's load-balancing loss of a mixture-of-experts model, as megatron-core adds it to the
objective, computed from transformers' router logits so the FSDP backend trains what Megatron does.

megatron-core's `aux_loss` (`switch_load_balancing_loss_func`, the Switch Transformer loss), per MoE
layer over the T tokens of a micro-batch: E * sum_i f_i * P_i, f_i the share of the T * k top-k
picks that went to expert i and P_i its mean softmax probability. Megatron adds each layer's term
times `moe_aux_loss_coeff` to the backward pass (scaled by 1 / the step's micro-batches), not to the
reported loss: the log-probs and the PPO loss never hold it. Megatron's micro-batches are the same
right-padded rows as FSDP's and it passes no padding mask, so every position is counted here too.
"""
from __future__ import annotations

import torch


def is_moe(model) -> bool:
    """A transformers MoE model whose forward gives router logits (Qwen3-MoE and kin)."""
    config = model.config
    return bool(getattr(config, "num_experts", 0)) and hasattr(config, "router_aux_loss_coef")


def load_balancing_loss(router_logits: tuple[torch.Tensor, ...], top_k: int) -> torch.Tensor:
    """The sum over MoE layers of E * sum_i f_i * P_i (no coefficient); each layer's logits are
    (tokens, E)."""
    total = router_logits[0].new_zeros((), dtype=torch.float32)
    for logits in router_logits:
        probs = torch.softmax(logits.float(), dim=-1)
        tokens, experts = probs.shape
        picks = torch.topk(logits, top_k, dim=-1).indices
        counts = torch.zeros(experts, device=probs.device).scatter_add_(
            0, picks.reshape(-1), torch.ones(picks.numel(), device=probs.device))
        total = total + experts * (counts / (tokens * top_k) * probs.mean(dim=0)).sum()
    return total
