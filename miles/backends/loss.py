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


@dataclass
class ImportanceWeights:
    """Per-token importance weights of the training policy against the rollout's (behaviour) policy."""

    raw: torch.Tensor  # (B, T) exp(old - rollout log-prob)
    clipped: torch.Tensor  # (B, T) clamped to [low, high]: what multiplies the policy loss (--use-tis)
    clipfrac: torch.Tensor  # (B, T) 1 where the clamp changed the weight


def importance_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, low: float,
                       high: float) -> ImportanceWeights:
    """Truncated importance sampling (Miles' --use-tis): the rollout's tokens came from the engine's weights,
    which may be versions behind the ones trained (async) or differ numerically; the weight corrects the
    policy gradient back to the trained policy. With the PPO ratio taken against the recomputed `old`
    (the proximal policy) this is decoupled PPO when a rollout feeds several optimizer steps."""
    raw = torch.exp((old_log_probs - rollout_log_probs).clamp(max=20.0))  # no inf on a wild mismatch
    clipped = raw.clamp(min=low, max=high)
    return ImportanceWeights(raw, clipped, (clipped != raw).float())


def mismatch_kl(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(rollout policy || trained policy) on the rollout's own tokens."""
    log_ratio = (old_log_probs - rollout_log_probs).clamp(min=-20.0, max=20.0)
    # exp(r) - 1 - r >= 0; expm1 keeps it accurate near r = 0, where float32 rounding of exp(r) - 1 went
    # negative (-4e-10 measured), and the clamp holds the sign the estimator has
    return (torch.expm1(log_ratio) - log_ratio).clamp(min=0.0)


def sample_ess(weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) normalised effective sample size of each sample's token weights, (sum w)^2 / (n sum w^2), in (0, 1]."""
    w = weights * mask
    n = mask.sum(-1).clamp(min=1)
    return w.sum(-1) ** 2 / (n * (w ** 2).sum(-1)).clamp(min=1e-12)


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
