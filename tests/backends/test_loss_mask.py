"""Observation tokens of a multi-turn sample stay out of the policy loss, the KL and the entropy."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from miles.backends.base import RankBatch
from miles.backends.batch import collate
from miles.backends.logprobs import TokenStats
from miles.backends.ppo import sample_losses

# prompt (3 tokens) | model turn (2) | tool observation (3) | model answer (2)
TOKENS = [5, 6, 7, 10, 11, 90, 91, 92, 12, 13]
LOSS_MASK = [1, 1, 0, 0, 0, 1, 1]
OBS = [4, 5, 6]  # positions (t predicts t+1) whose targets are the observation's tokens 5, 6, 7
CFG = SimpleNamespace(eps_clip=0.2, eps_clip_high=None, entropy_coef=0.01, kl_loss_coef=0.1,
                      kl_loss_type="low_var_kl", use_tis=False)


def batch(loss_masks) -> RankBatch:
    return RankBatch(tokens=[TOKENS], response_lengths=[7], advantages=[0.7], rollout_log_probs=[[-0.5] * 7],
                     step_sizes=[1], global_step_sizes=[1], loss_masks=loss_masks)


def losses(mb, log_probs, old, ref, entropy):
    terms = sample_losses(TokenStats(log_probs, entropy), old, ref, mb, CFG)
    return torch.stack([terms.loss, terms.pg, terms.entropy, terms.kl, terms.clipfrac, terms.ppo_kl])


def test_mask_covers_model_tokens_only():
    mb = collate(batch([LOSS_MASK]), [0], 0, 0, torch.device("cpu"))
    assert mb.response_mask[0].tolist() == [0, 0, 1, 1, 0, 0, 0, 1, 1]
    unmasked = collate(batch(None), [0], 0, 0, torch.device("cpu"))
    assert unmasked.response_mask[0].tolist() == [0, 0] + [1] * 7


def test_huge_advantage_and_wild_log_probs_on_observation_tokens_leave_the_loss_unchanged():
    gen = torch.Generator().manual_seed(0)
    shape = (1, len(TOKENS) - 1)
    log_probs = -torch.rand(shape, generator=gen) - 0.1
    old = log_probs + 0.3 * torch.randn(shape, generator=gen)  # ratios far from 1: some clipped
    ref = log_probs + 0.2 * torch.randn(shape, generator=gen)
    entropy = torch.rand(shape, generator=gen)
    mb = collate(batch([LOSS_MASK]), [0], 0, 0, torch.device("cpu"))
    before = losses(mb, log_probs, old, ref, entropy)

    tampered = [t.clone() for t in (log_probs, old, ref, entropy)]
    for t, wild in zip(tampered, (-30.0, 5.0, -40.0, 1e4)):
        t[0, OBS] = wild
    mb.advantages[0, OBS] = 1e9
    after = losses(mb, *tampered)
    assert torch.equal(before, after)

    # Without the mask the same tampering moves every term: the test above can fail.
    plain = collate(batch(None), [0], 0, 0, torch.device("cpu"))
    plain.advantages[0, OBS] = 1e9
    assert not torch.allclose(losses(plain, *tampered)[:2], before[:2])
