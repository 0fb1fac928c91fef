"""Watch it live: a real `python -m miles.train --use-mlflow` run (no checkpoint until its end) is
followed through its MLflow store while it runs; every recorded point must be there within
LAG_BOUND_S of its journal line, long before the run ends; at its end the scorecard is printed and is the
MLflow run's description."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tracking_helpers import REPO, subprocess_env

from miles.record.journal import read_journal
from miles.record.names import step_of
from miles.tracking.sinks.mlflow_sink import charted_in_mlflow
from miles.tracking.state import DeliveryState
from tests.support.flags import LIVE

pytestmark = pytest.mark.slow
LAG_BOUND_S = 10.0  # the bound: every point in the tracker within 10 s of its record
RUN_TIMEOUT_S = 600.0


def mlflow_points(run_dir: Path) -> set[tuple[str, int]]:
    """(key, step) of every point in the run's MLflow store, read as a watcher would (nothing if not there yet)."""
    sink = DeliveryState.load(run_dir).sinks.get("mlflow")
    store = run_dir.parent / "mlflow.db"  # the default store, shared by the runs beside this one
    if sink is None or not sink.spec.options.get("run_id") or not store.exists():
        return set()
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30) as db:
        rows = db.execute("SELECT key, step FROM metrics WHERE run_uuid = ?", (sink.spec.options["run_id"],))
        return set(rows)


def mlflow_description(run_dir: Path) -> str:
    from mlflow.tracking import MlflowClient

    from miles.tracking.sinks.mlflow_sink import DESCRIPTION_TAG

    spec = DeliveryState.load(run_dir).sinks["mlflow"].spec.options
    return MlflowClient(tracking_uri=spec["tracking_uri"]).get_run(spec["run_id"]).data.tags[DESCRIPTION_TAG]


def delivery_log(run_dir: Path) -> str:
    path = run_dir / "tracking" / "delivery.log"
    return path.read_text()[-3000:] if path.exists() else "(none)"


def test_recorded_points_reach_mlflow_within_the_bound_while_the_run_goes_on(tmp_path, base_model):
    run_dir = tmp_path / "run"
    output = tmp_path / "train.log"
    with output.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "miles.train", *LIVE, "--use-mlflow",
                                 "--run-dir", str(run_dir)], cwd=REPO, env=subprocess_env(), stdout=out,
                                stderr=subprocess.STDOUT)
    recorded_at: dict[int, float] = {}  # journal line -> when this watcher first saw it (within 0.2 s)
    lags: list[float] = []
    delivered, delivered_while_running = 0, 0
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while proc.poll() is None or delivered < len(recorded_at):
            assert time.monotonic() < deadline, "the run did not finish in time"
            now = time.monotonic()
            lines = read_journal(run_dir / "metrics.jsonl")
            for line in range(len(recorded_at), len(lines)):
                recorded_at[line] = now
            points = mlflow_points(run_dir)
            while delivered < len(recorded_at) and all(
                    (key, step_of(key, lines[delivered].metrics, lines[delivered].rollout_id)) in points
                    for key in charted_in_mlflow(lines[delivered].metrics)):  # the sink's rule: no step axes, no flat zeros
                lags.append(now - recorded_at[delivered])
                delivered += 1
            waiting = [line for line in range(delivered, len(recorded_at)) if now - recorded_at[line] > LAG_BOUND_S]
            assert not waiting, (f"journal lines {waiting} recorded more than {LAG_BOUND_S}s ago are not in MLflow; "
                                 f"delivery log:\n{delivery_log(run_dir)}")
            if proc.poll() is None:
                delivered_while_running = delivered
            time.sleep(0.2)  # the watcher's poll interval
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == 0, output.read_text()[-3000:]
    # the run ends with its scorecard in the terminal and as the MLflow run's description
    printed = output.read_text()
    assert f"python -m miles.train: scorecard of {run_dir}" in printed and "  held-out eval  " in printed
    description = mlflow_description(run_dir)
    assert description.startswith("GRPO (fsdp) of ") and f"## Scorecard of `{run_dir.name}`" in description
    assert delivered == len(recorded_at) >= 5  # one line per rollout (plus evals)
    assert delivered_while_running >= 3  # watched while the run went on, not all delivered at its end
    print(json.dumps({"live_lag_p50_s": round(sorted(lags)[len(lags) // 2], 2), "live_lag_max_s": round(max(lags), 2),
                      "lines": len(lags)}))
