"""Baselines reach MLflow: `miles compare ... --mlflow-tracking-uri` tags the run's MLflow run with its
baselines and verdicts (a real MLflow SQLite store), and a rerun leaves no stale signal tag."""
from __future__ import annotations

from compare_helpers import copy_run, edit_journal, miles
from mlflow.tracking import MlflowClient


def test_compare_tags_the_mlflow_run(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("miles")
    run_id = client.create_run(experiment, run_name="run").info.run_id
    base = copy_run(tmp_path / "base")
    run = copy_run(tmp_path / "run")
    edit_journal(run, lambda r: r["rollout_id"] == 3 and r.update({"train/grad_norm": r["train/grad_norm"] * 3}))
    done = miles("compare", run, base, "--mlflow-tracking-uri", uri)
    assert done.returncode == 1, done.stderr
    tags = client.get_run(run_id).data.tags
    assert tags["miles.compare"] == "regression" and tags["miles.compare.baselines"] == "base"
    assert tags["miles.compare.train/grad_norm"] == "outside at train/step 3"
    edit_journal(run, lambda r: r["rollout_id"] == 3 and r.update({"train/grad_norm": r["train/grad_norm"] / 3}))
    assert miles("compare", run, base, "--mlflow-tracking-uri", uri).returncode == 0
    tags = client.get_run(run_id).data.tags
    assert tags["miles.compare"] == "within" and "miles.compare.train/grad_norm" not in tags
    missing = miles("compare", run, base, "--mlflow-tracking-uri", uri, "--mlflow-experiment-name", "other")
    assert missing.returncode == 2 and "no MLflow run named 'run'" in missing.stderr
