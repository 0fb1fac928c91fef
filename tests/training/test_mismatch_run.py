"""The train-vs-rollout mismatch figures (miles.backends.mismatch) of a real tiny run, in every
tracker: the session's plain run (tests/support/sessions.py: real engine, FSDP trainer, W&B
offline, MLflow and TensorBoard), read, not run again."""
from __future__ import annotations

import math

import pytest

from miles.record.journal import read_journal
from tests.support.sessions import PLAIN_RUN_TIMEOUT_S
from tests.tracking.tracking_helpers import mlflow_points, tensorboard_points, wandb_points

SCALARS = [f"train/mismatch_{k}" for k in ("k1", "k2", "k3", "ratio_p99", "ratio_max",
                                           "ratio_beyond_tis_clip", "adv_opposed_frac")]


@pytest.mark.slow
@pytest.mark.timeout(PLAIN_RUN_TIMEOUT_S)
def test_a_real_run_logs_the_mismatch_figures_in_every_tracker(plain_run):
    lines = read_journal(plain_run.run_dir / "metrics.jsonl")
    rows = [ln.metrics for ln in lines if ln.rollout_id >= 0]
    assert len(rows) == 2
    for m in rows:
        assert set(SCALARS) <= set(m)
        # the same fp32 weights on both sides: the figures sit at rounding level
        assert m["train/mismatch_k2"] >= 0 and 0 <= m["train/mismatch_k3"] <= 1e-6
        assert abs(m["train/mismatch_k1"]) <= 1e-3
        p99, peak = m["train/mismatch_ratio_p99"], m["train/mismatch_ratio_max"]
        assert 1 - 1e-3 <= p99 <= peak <= 1 + 1e-2
        assert m["train/mismatch_ratio_beyond_tis_clip"] == 0.0
        assert 0.0 <= m["train/mismatch_adv_opposed_frac"] <= 1.0
        shares = [v for k, v in m.items() if k.startswith("train/mismatch_pos/tokens/")]
        assert shares and math.isclose(sum(shares), 1.0, rel_tol=1e-9)
        buckets = [k for k in m if k.startswith("train/mismatch_pos/tokens/")]
        assert all(k.replace("/tokens/", "/k3/") in m for k in buckets)
    mine = [k for k in rows[0] if k.startswith("train/mismatch_")]
    trackers = {"mlflow": mlflow_points(plain_run.run_dir, mine),
                "tensorboard": tensorboard_points(plain_run.run_dir / "tensorboard"),
                "wandb": wandb_points(plain_run.run_dir)}
    for name, points in trackers.items():
        for key in mine:
            values = [v for _, v in points.get(key, [])]
            want = [row[key] for row in rows if key in row]
            assert len(values) == len(want), f"{name}: {key} has {values}"
            assert all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
                       for a, b in zip(values, want)), key
