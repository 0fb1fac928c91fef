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


def test_a_run_given_baselines_is_compared_and_tagged_at_its_end(tmp_path, capsys):
    """What both drivers call once the trackers are closed (`--baseline-run-dirs`), and the flow's artifact."""
    from miles.compare.comparison import format_markdown
    from miles.compare.run_end import compare_at_end
    from miles.config import ConfigError, parse_config

    base = copy_run(tmp_path / "base")
    run = copy_run(tmp_path / "run")
    edit_journal(run, lambda r: r["rollout_id"] >= 2 and r.update({"rollout/raw_reward": 0.0}))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.create_experiment("miles"), run_name="run").info.run_id
    config = parse_config(["--run-dir", str(run), "--baseline-run-dirs", str(base), "--use-mlflow",
                           "--mlflow-tracking-uri", uri])
    result = compare_at_end(config)
    assert result.failed and result.failed[0].key == "rollout/raw_reward" and result.failed[0].first.step == 2
    assert "regressions: rollout/raw_reward" in capsys.readouterr().out
    assert client.get_run(run_id).data.tags["miles.compare.rollout/raw_reward"] == "outside at rollout/step 2"
    markdown = format_markdown(result)
    assert "**regression**" in markdown and "| `rollout/raw_reward` | outside | 2 |" in markdown
    assert compare_at_end(parse_config(["--run-dir", str(run)])) is None  # no baselines: nothing to do
    import pytest

    from miles.compare.run_end import check_baselines  # what preflight runs before anything starts

    with pytest.raises(ConfigError, match="--baseline-run-dirs: .* is not a run directory"):
        check_baselines([str(tmp_path)], str(run))
    with pytest.raises(ConfigError, match="the run's own directory"):
        check_baselines([str(run)], str(run))
