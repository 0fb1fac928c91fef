"""Loss terms of Miles' policy loss: PPO-clip, KL to the reference, entropy (backend-free, torch only).

All functions take per-token tensors of shape (B, T) plus a (B, T) 0/1 response mask and
return per-token values; `sample_mean` turns them into per-sample means (B,).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def sample_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) mean over each sample's response tokens."""
    return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)


@dataclass
class PolicyLoss:
    pg_losses: torch.Tensor  # (B, T)
    clipfrac: torch.Tensor  # (B, T), 1 where the clipped branch was taken
    ppo_kl: torch.Tensor  # (B, T), old - new log-prob


def ppo_clip_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                  eps_clip: float, eps_clip_high: float) -> PolicyLoss:
    """PPO's clipped surrogate, as slime's compute_policy_loss (without dual clip)."""
    ppo_kl = old_log_probs - log_probs
    ratio = torch.exp(-ppo_kl)
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high) * advantages
    return PolicyLoss(torch.maximum(unclipped, clipped), (clipped > unclipped).float(), ppo_kl)


def approx_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kl_type: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimators: k1, k2, k3 (= low_var_kl, clamped like slime)."""
    log_ratio = log_probs - ref_log_probs
    if kl_type == "k1":
        return log_ratio
    if kl_type == "k2":
        return log_ratio ** 2 / 2.0
    if kl_type in ("k3", "low_var_kl"):
        neg = -log_ratio
        return (neg.exp() - 1 - neg).clamp(min=-10, max=10)
    raise ValueError(f"unknown --kl-loss-type {kl_type!r}")
