"""Review N33: `python -m miles.train --use-mlflow` ended with `MLflow  mlflow ui
--backend-store-uri ...` and no link to its run, while `miles train`'s card gives the run's page
beside the same command."""
from __future__ import annotations

from miles.config import parse_config
from miles.record.journal import Journal, JournalLine


def test_the_plain_drivers_card_links_its_mlflow_run(tmp_path, capsys):
    import mlflow

    from miles.train import print_scorecard

    run_dir, uri = tmp_path / "runs" / "20261207-010203", f"sqlite:///{tmp_path}/runs/mlflow.db"
    run_dir.mkdir(parents=True)
    Journal(run_dir).append(JournalLine(0, 1.0, {"rollout/raw_reward": 0.3}))
    config = parse_config(["--use-mlflow", "--run-dir", str(run_dir), "--mlflow-tracking-uri", uri])
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment(config.tracking.mlflow_experiment_name)
    run = client.create_run(experiment, run_name=run_dir.name)
    print_scorecard(config, 2.0)
    card = capsys.readouterr().out
    mlflow_row = next(line for line in card.splitlines() if line.strip().startswith("MLflow"))
    assert f"http://127.0.0.1:5000/#/experiments/{experiment}/runs/{run.info.run_id}" in mlflow_row
    assert "serve it first" in mlflow_row  # a local store: the serving command stays beside it
