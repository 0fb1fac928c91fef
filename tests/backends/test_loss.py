"""Loss terms and the LR schedule, on hand-worked numbers."""
import math

import pytest
import torch

from miles.backends.loss import approx_kl, ppo_clip_loss, sample_mean
from miles.backends.schedule import lr_at


def test_sample_mean_ignores_padding():
    values = torch.tensor([[1.0, 3.0, 100.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert sample_mean(values, mask).tolist() == [2.0, 2.0]


def test_ppo_clip_at_ratio_one_is_minus_advantage_and_unclipped():
    lp = torch.tensor([[-1.0, -2.0]])
    out = ppo_clip_loss(lp, lp.clone(), torch.tensor([[0.5, -1.0]]), 0.2, 0.28)
    assert out.pg_losses.tolist() == [[-0.5, 1.0]]
    assert out.clipfrac.sum() == 0 and out.ppo_kl.abs().sum() == 0


def test_ppo_clip_uses_the_asymmetric_range():
    old = torch.zeros(1, 2)
    new = torch.tensor([[math.log(1.5), math.log(0.5)]])  # ratios 1.5 and 0.5
    out = ppo_clip_loss(new, old, torch.tensor([[1.0, -1.0]]), 0.2, 0.28)
    # A>0, ratio 1.5 clipped to 1.28 -> -1.28; A<0, ratio 0.5 clipped to 0.8 -> 0.8
    assert out.pg_losses[0].tolist() == pytest.approx([-1.28, 0.8])
    assert out.clipfrac.tolist() == [[1.0, 1.0]]
    assert out.ppo_kl[0].tolist() == pytest.approx([-math.log(1.5), -math.log(0.5)])


def test_kl_estimators():
    lp, ref = torch.tensor([0.0]), torch.tensor([math.log(0.5)])  # log ratio = log 2
    r = math.log(2.0)
    assert approx_kl(lp, ref, "k1").item() == pytest.approx(r)
    assert approx_kl(lp, ref, "k2").item() == pytest.approx(r * r / 2)
    assert approx_kl(lp, ref, "k3").item() == pytest.approx(0.5 - 1 + r)  # e^{-r} - 1 + r
    assert approx_kl(lp, ref, "low_var_kl").item() == approx_kl(lp, ref, "k3").item()
    with pytest.raises(ValueError, match="k9"):
        approx_kl(lp, ref, "k9")


def test_lr_schedule():
    kw = dict(lr=1.0, min_lr=0.1, warmup=2, decay_steps=12)
    assert [lr_at(s, decay_style="constant", **kw) for s in range(4)] == [0.5, 1.0, 1.0, 1.0]
    assert lr_at(2, decay_style="linear", **kw) == 1.0
    assert lr_at(7, decay_style="linear", **kw) == pytest.approx(0.55)  # half way from 1.0 to 0.1
    assert lr_at(12, decay_style="cosine", **kw) == pytest.approx(0.1)
    assert lr_at(7, decay_style="cosine", **kw) == pytest.approx(0.55)
