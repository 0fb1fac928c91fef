"""Review N34: the loss panel ran at the 1e-8 scale under "healthy: slow decay over hundreds of
iterations"; GRPO's policy loss averages advantages of mean 0, so near 0 is what healthy looks like,
and the panel says so."""
from __future__ import annotations

from tests.support.dashboard import RECORDED

from miles.dashboard.run_files import RunFiles
from miles.dashboard.views import watch


def test_the_loss_panel_says_it_is_near_zero_by_construction():
    loss = next(p for p in watch(RunFiles(RECORDED))["panels"] if p["keys"] == ["train/loss"])
    assert "near 0 by construction in GRPO" in loss["healthy"]
    # the recorded run: it is near 0
    assert max(abs(y) for y in loss["series"]["train/loss"]["y"]) < 1e-3
