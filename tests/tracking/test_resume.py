"""A run SIGKILLed after recording past its last checkpoint, resumed twice from it: the redone
rollouts keep their first line, and each tracker, fed live, still holds exactly one point per
metric and step, equal to the journal, in the same wandb and MLflow runs."""
from __future__ import annotations

import os
import signal

import pytest
import wandb
from tracking_helpers import ALL_TRACKERS, assert_all_trackers_equal_journal, run_synthetic

from miles.record.journal import read_journal
from miles.tracking.state import DeliveryState


@pytest.fixture
def parent_wandb_service(monkeypatch):
    """A wandb service in this (the parent) process, as after any earlier in-process wandb use: the
    delivery processes must not share it, or a killed run's id stays "in use" and never reopens.
    An earlier test may have left a singleton whose WANDB_SERVICE is gone, so start afresh."""
    monkeypatch.delenv("WANDB_SERVICE", raising=False)
    wandb.teardown()
    wandb.setup()
    assert "WANDB_SERVICE" in os.environ
    yield
    wandb.teardown()


def test_killed_run_resumes_exactly_once(run_dir, parent_wandb_service):
    flags = ["--rollouts", "7", "--save-interval", "2", *ALL_TRACKERS]
    # checkpoints at rollout 1, records rollout 2, killed right after (its delivery may be mid-way)
    first = run_synthetic(run_dir, *flags, "--kill-at", "2", "--wait-trackers-open", check=False)
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert [ln.rollout_id for ln in read_journal(run_dir / "metrics.jsonl")] == [0, 1, 2]
    ids = {name: s.spec.options.get("run_id") for name, s in DeliveryState.load(run_dir).sinks.items()}

    # resumes at 2 (redone), checkpoints at 3, records 4, killed again
    second = run_synthetic(run_dir, *flags, "--kill-at", "4", "--wait-trackers-open", check=False)
    assert second.returncode == -signal.SIGKILL, second.stderr

    run_synthetic(run_dir, *flags)  # resumes at 4 (redone) and finishes
    journal = read_journal(run_dir / "metrics.jsonl")
    assert [ln.rollout_id for ln in journal] == list(range(7))
    redone = read_journal(run_dir / "tracking" / "redone.jsonl")  # the redo's own lines, kept aside
    assert [ln.rollout_id for ln in redone] == [2, 4]
    assert all(r.metrics["perf/rollout_time"] != journal[r.rollout_id].metrics["perf/rollout_time"] for r in redone)
    points = assert_all_trackers_equal_journal(run_dir)
    assert [s for s, _ in points["rollout/step"]] == list(range(7))  # one point per step, no gap
    state = DeliveryState.load(run_dir)
    assert state.sinks["wandb"].spec.options["run_id"] == ids["wandb"]  # the same runs continued
    assert state.sinks["mlflow"].spec.options["run_id"] == ids["mlflow"]
    assert len(list(run_dir.glob("wandb/offline-run-*"))) == 3  # one offline dir per process, one run id
