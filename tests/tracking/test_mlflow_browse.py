"""MLflow as a user browses it, read back through its client: the experiment's kind, the run's name,
tags and description, and MLflow's system metrics (on by default, off with a flag)."""
from __future__ import annotations

import subprocess

from tracking_helpers import REPO, run_synthetic, subprocess_env

from miles.tracking.state import DeliveryState

FLOW_RUN_URL = "http://127.0.0.1:4200/runs/flow-run/00000000-0000-0000-0000-000000000001"


def mlflow_run(run_dir):
    from mlflow.tracking import MlflowClient

    spec = DeliveryState.load(run_dir).sinks["mlflow"].spec.options
    client = MlflowClient(tracking_uri=spec["tracking_uri"])
    run = client.get_run(spec["run_id"])
    return client, run


def test_runs_are_named_tagged_described_and_have_system_metrics_unless_turned_off(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first, second = tmp_path / "grpo-arith-lr3", tmp_path / "second"
    first.mkdir(), second.mkdir()
    run_synthetic(first, "--rollouts", "2", "--use-mlflow", "--mlflow-tracking-uri", store,
                  env=subprocess_env(MILES_PREFECT_FLOW_RUN_URL=FLOW_RUN_URL))
    client, run = mlflow_run(first)
    assert client.get_experiment(run.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    assert run.info.run_name == "grpo-arith-lr3"
    tags = run.data.tags
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert {k: tags.get(k) for k in ("miles.train_backend", "miles.task", "miles.version", "prefect.flow_run_url",
                                     "mlflow.source.git.commit")} == {
        "miles.train_backend": "fsdp", "miles.task": "arithmetic", "miles.version": "0.1.0",
        "prefect.flow_run_url": FLOW_RUN_URL, "mlflow.source.git.commit": commit or None}
    assert tags["miles.model"] == "tiny-qwen3 (built in)" and tags["miles.run_dir"] == str(first.resolve())
    # the run page's "Source": the entry point (a run recorded for a flow run is `miles train`'s)
    assert (tags["mlflow.source.type"], tags["mlflow.source.name"]) == ("LOCAL", "miles train (Prefect flow grpo)")
    assert tags["mlflow.note.content"].startswith("GRPO (fsdp) of ") and "2 rollouts" in tags["mlflow.note.content"]
    system = {k for k in run.data.metrics if k.startswith("system/")}
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= system

    # a second run in the same experiment: its own name from the flag, no system metrics when turned off
    env = {k: v for k, v in subprocess_env().items() if k != "MILES_PREFECT_FLOW_RUN_URL"}
    run_synthetic(second, "--rollouts", "1", "--use-mlflow", "--mlflow-tracking-uri", store,
                  "--mlflow-run-name", "custom-name", "--no-mlflow-system-metrics", env=env)
    client, run = mlflow_run(second)
    assert run.info.run_name == "custom-name" and "prefect.flow_run_url" not in run.data.tags
    assert run.data.tags["mlflow.source.name"] == "python -m miles.train"
    assert "train/loss" in run.data.metrics and not [k for k in run.data.metrics if k.startswith("system/")]
    experiment = client.get_experiment(run.info.experiment_id)
    assert [r.info.run_name for r in client.search_runs([experiment.experiment_id], order_by=["start_time"])] == [
        "grpo-arith-lr3", "custom-name"]


def test_mlflow_ui_flag_serves_the_store_and_is_checked(tmp_path):
    import os
    import signal

    import httpx
    import pytest

    from miles.config import ConfigError, parse_config
    from miles.mlflow_ui.launch import start_ui, ui_command

    with pytest.raises(ConfigError, match="--mlflow-ui: needs --use-mlflow"):
        parse_config(["--mlflow-ui"])
    with pytest.raises(ConfigError, match="--mlflow-ui: --mlflow-tracking-uri http://mlflow:5000 is a tracking server"):
        parse_config(["--mlflow-ui", "--use-mlflow", "--mlflow-tracking-uri", "http://mlflow:5000"])
    from miles.config.commands import runnable

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # spelled as it runs when pasted: bare `mlflow` with the venv on PATH, `.venv/bin/mlflow` without
    # one worker, as start_ui runs it: MLflow's four take a minute to come up on a small, busy machine
    assert ui_command(store) == (f"{runnable('mlflow')} ui --backend-store-uri {store} --host 127.0.0.1 --port 5000 "
                                 f"--workers 1 --app-name miles")
    ui = start_ui(store, tmp_path)
    try:
        assert ui.url.startswith("http://127.0.0.1:")
        found = httpx.post(f"{ui.url}/ajax-api/2.0/mlflow/experiments/search", json={"max_results": 10}, timeout=30)
        assert found.status_code == 200 and "experiments" in found.json()
        # the server and its one worker, without MLflow's job runner and huey consumers (GenAI jobs)
        started = session_commands(ui.pid)
        assert started and not [c for c in started if "huey" in c or "jobs._job_runner" in c], started
    finally:
        os.killpg(ui.pid, signal.SIGTERM)  # its own session: the server and its workers


def session_commands(sid: int) -> list[str]:
    """The command lines of the processes in session `sid` (start_ui starts the UI in its own)."""
    from pathlib import Path

    commands = []
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
            if proc.name.isdigit() and int(stat[stat.rindex(")") + 2:].split()[3]) == sid:
                commands.append((proc / "cmdline").read_text().replace("\0", " "))
        except (OSError, ValueError):
            continue
    return commands


def test_the_ui_runs_without_mlflows_job_execution_unless_asked():
    from miles.mlflow_ui.launch import JOB_EXECUTION_ENV, ui_env

    assert ui_env({"PATH": "/bin", "WANDB_API_KEY": "x" * 8})[JOB_EXECUTION_ENV] == "false"
    assert "WANDB_API_KEY" not in ui_env({"WANDB_API_KEY": "x" * 8})
    assert ui_env({JOB_EXECUTION_ENV: "true"})[JOB_EXECUTION_ENV] == "true"  # the user's choice stands
