"""First-hour N7: runs beside each other share one MLflow store by default (FOLDER/mlflow.db), so MLflow's
run list and compare view hold all of them and every printed `mlflow ui` command opens a UI in which each
run's link works; each run's artifacts keep a folder of their own; runs started together create the store
once; `--mlflow-tracking-uri` still gives one run its own store."""
from __future__ import annotations

import concurrent.futures

from tracking_helpers import run_synthetic

from miles.config import parse_config
from miles.config.resolve import resolve
from miles.tracking.state import DeliveryState


def test_runs_in_one_folder_resolve_to_one_store(tmp_path):
    a = resolve(parse_config(["--run-dir", str(tmp_path / "a")]))
    b = resolve(parse_config(["--run-dir", str(tmp_path / "b")]))
    assert a.tracking.mlflow_tracking_uri == b.tracking.mlflow_tracking_uri == f"sqlite:///{tmp_path / 'mlflow.db'}"
    own = resolve(parse_config(["--run-dir", str(tmp_path / "c"),
                                "--mlflow-tracking-uri", f"sqlite:///{tmp_path / 'c' / 'mlflow.db'}"]))
    assert own.tracking.mlflow_tracking_uri == f"sqlite:///{tmp_path / 'c' / 'mlflow.db'}"


def test_two_runs_started_together_share_the_store_with_their_own_artifacts(tmp_path):
    from mlflow.tracking import MlflowClient

    dirs = [tmp_path / "seed-1", tmp_path / "seed-2"]
    for d in dirs:
        d.mkdir()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # each a process: both create the new store at once
        list(pool.map(lambda d: run_synthetic(d, "--rollouts", "2", "--use-mlflow"), dirs))
    specs = [DeliveryState.load(d).sinks["mlflow"].spec.options for d in dirs]
    assert {s["tracking_uri"] for s in specs} == {f"sqlite:///{tmp_path / 'mlflow.db'}"}
    client = MlflowClient(tracking_uri=specs[0]["tracking_uri"])
    runs = client.search_runs([client.get_experiment_by_name("miles").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["seed-1", "seed-2"]
    assert {r.info.run_id for r in runs} == {s["run_id"] for s in specs}
    for run in runs:
        assert run.info.status == "FINISHED"
        assert run.info.artifact_uri == (tmp_path / "mlartifacts" / run.info.run_id / "artifacts").as_uri()
        assert "metrics.jsonl" in {f.path for f in client.list_artifacts(run.info.run_id)}
    assert not any((d / "mlflow.db").exists() for d in dirs)
