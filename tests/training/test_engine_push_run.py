"""Issue 54, the engine side of a real run: the session's plain run (tests/support/sessions.py: one
embedded engine, FSDP trainer, every tracker), read, not run again. Its engine wrote its own phases
of each weight push on its timeline lane with its coordinates, and each rollout's journal row holds
perf/update_weights_engine_time/{min,p50,max}, that engine's own receive+apply seconds of the push
(its spans' sum), in every tracker."""
from __future__ import annotations

import math

import pytest

from miles.record import layout
from miles.record.journal import read_journal
from miles.record.timeline import read_spans
from miles.run.engine_stragglers import KEY
from tests.support.sessions import PLAIN_RUN_TIMEOUT_S
from tests.tracking.tracking_helpers import mlflow_points, tensorboard_points, wandb_points

STATS = [KEY + s for s in ("min", "p50", "max")]


@pytest.mark.slow
@pytest.mark.timeout(PLAIN_RUN_TIMEOUT_S)
def test_a_real_run_logs_its_engines_push_spans_and_times_in_every_tracker(plain_run):
    spans = read_spans(plain_run.run_dir / layout.TIMELINE)
    pushes = [s for s in spans if s.lane == "trainer" and s.name == "update_weights"]
    mine = [s for s in spans if s.lane.startswith("engine") and "kind" in s.args]
    assert pushes and mine
    assert {s.args["engine"] for s in mine} == {0}
    (url,) = {s.args["url"] for s in mine}
    assert {s.args["coords"] for s in mine} == {f"engine0 {url}"}
    rows = {ln.rollout_id: ln.metrics for ln in read_journal(plain_run.run_dir / layout.JOURNAL)
            if ln.rollout_id >= 0}
    for push in pushes:
        inside = [s for s in mine if push.start <= s.start and s.end <= push.end]
        names = {(s.name, s.args["kind"]) for s in inside}
        assert {("receive", "compute"), ("apply", "compute"), ("wait", "wait")} <= names
        own = sum(s.end - s.start for s in inside
                  if s.name in ("receive", "apply") and s.args["kind"] == "compute")
        row = rows[push.rollout_id]
        assert row[KEY + "min"] == row[KEY + "p50"] == row[KEY + "max"]  # one engine
        assert row[KEY + "max"] == pytest.approx(own, abs=1e-4)  # spans keep 6 decimals
        assert KEY + "slowest" not in row  # one engine is no one's straggler
    logged = [rid for rid, row in sorted(rows.items()) if KEY + "max" in row]
    assert logged == sorted(p.rollout_id for p in pushes)
    trackers = {"mlflow": mlflow_points(plain_run.run_dir, STATS),
                "tensorboard": tensorboard_points(plain_run.run_dir / "tensorboard"),
                "wandb": wandb_points(plain_run.run_dir)}
    for name, points in trackers.items():
        for key in STATS:
            values = [v for _, v in points.get(key, [])]
            want = [rows[rid][key] for rid in logged]
            assert len(values) == len(want), f"{name}: {key} has {values}"
            assert all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
                       for a, b in zip(values, want)), key
