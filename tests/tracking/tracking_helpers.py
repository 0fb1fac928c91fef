"""Helpers of the tracking tests: run the synthetic loop, read every tracker back as
{key: [(step, value), ...]} in the same shape as the journal."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from miles.record.journal import read_journal
from miles.record.names import STEP_KEYS, step_key, step_of
from miles.tracking.state import DeliveryState
from miles.tracking.wandb_files import read_offline_run

REPO = Path(__file__).resolve().parents[2]
SYNTHETIC = Path(__file__).with_name("synthetic.py")
ALL_TRACKERS = ["--use-wandb", "--use-mlflow", "--use-tensorboard"]

Points = dict[str, list[tuple[int, float]]]


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), WANDB_SILENT="true", **extra)
    env.pop("WANDB_API_KEY", None) if "WANDB_API_KEY" not in extra else None
    return env


def run_synthetic(run_dir: Path, *args: str, env: dict | None = None, check: bool = True,
                  timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(SYNTHETIC), "--run-dir", str(run_dir), *args],
                          capture_output=True, text=True, env=env or subprocess_env(), timeout=timeout, cwd=run_dir.parent)
    if check and proc.returncode != 0:
        raise AssertionError(f"synthetic loop failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def journal_points(run_dir: Path) -> Points:
    points: Points = defaultdict(list)
    for line in read_journal(run_dir / "metrics.jsonl"):
        for key, value in line.metrics.items():
            points[key].append((step_of(key, line.metrics, line.rollout_id), value))
    return {k: sorted(v) for k, v in points.items()}


def charted(points: Points) -> Points:
    """What MLflow holds of the journal's points: the sink's rule (charted_in_mlflow: no step axes, no health
    zeros, no eval/<set> twin of its pass_at_1) applied to the points that share a step axis and a step."""
    from miles.tracking.sinks.mlflow_sink import charted_in_mlflow

    at: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    for key, pts in points.items():
        for step, value in pts:
            at[(step_key(key), step)][key] = value
    out: Points = defaultdict(list)
    for (_, step), metrics in at.items():
        for key, value in charted_in_mlflow(metrics).items():
            out[key].append((step, value))
    return {k: sorted(v) for k, v in out.items()}


def mlflow_points(run_dir: Path, keys) -> Points:
    """MLflow's points of `keys`, the step axes left out (compare with `charted`)."""
    from mlflow.tracking import MlflowClient

    spec = DeliveryState.load(run_dir).sinks["mlflow"].spec.options
    client = MlflowClient(tracking_uri=spec["tracking_uri"])
    got = {k: sorted((m.step, m.value) for m in client.get_metric_history(spec["run_id"], k))
           for k in keys if k not in STEP_KEYS}
    return {k: v for k, v in got.items() if v}  # a key the sink never charts (a healthy run's health/*) has none


def mlflow_metric_keys(run_dir: Path) -> set[str]:
    from mlflow.tracking import MlflowClient

    spec = DeliveryState.load(run_dir).sinks["mlflow"].spec.options
    metrics = MlflowClient(tracking_uri=spec["tracking_uri"]).get_run(spec["run_id"]).data.metrics
    return {k for k in metrics if not k.startswith("system/")}  # MLflow's own system metrics are not the journal's


def tensorboard_points(log_dir: Path) -> Points:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: sorted((e.step, e.value) for e in acc.Scalars(tag)) for tag in acc.Tags()["scalars"]}


def wandb_points(run_dir: Path) -> Points:
    spec = DeliveryState.load(run_dir).sinks["wandb"].spec.options
    points: Points = defaultdict(list)
    for row in read_offline_run(Path(spec["directory"]), spec["run_id"]).history:
        for key, value in row.items():
            if key.startswith("_") or key.startswith("rollout/samples"):
                continue
            points[key].append((int(row[step_key(key)]), value))
    return {k: sorted(v) for k, v in points.items()}


def assert_points_equal(tracker: str, got: Points, want: Points) -> None:
    """Same keys, and per key the same (step, value) list: no duplicates, no gaps. TensorBoard
    stores float32, so values compare to 1e-6 relative."""
    assert set(got) == set(want), f"{tracker}: keys differ: missing {set(want) - set(got)}, extra {set(got) - set(want)}"
    for key in want:
        g, w = got[key], want[key]
        assert [s for s, _ in g] == [s for s, _ in w], f"{tracker}: {key} steps {[s for s, _ in g]} != {[s for s, _ in w]}"
        for (_, gv), (_, wv) in zip(g, w):
            assert math.isclose(gv, wv, rel_tol=1e-6, abs_tol=1e-9), f"{tracker}: {key} value {gv} != {wv}"


def assert_all_trackers_equal_journal(run_dir: Path) -> Points:
    want = journal_points(run_dir)
    assert want, "the journal is empty"
    # MLflow: every point at its step, and the step axes not as charts of their own
    assert_points_equal("mlflow", mlflow_points(run_dir, want), charted(want))
    assert mlflow_metric_keys(run_dir) == set(charted(want))
    assert_points_equal("tensorboard", tensorboard_points(run_dir / "tensorboard"), want)
    assert_points_equal("wandb", wandb_points(run_dir), want)
    return want


