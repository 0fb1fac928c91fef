"""`mlflow ui` for a run's MLflow store: the command to type, or (`--mlflow-ui`) the UI started on loopback and left up,
and links that open its pages (a run's too) in the model-training view."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from miles.config import MilesConfig
from miles.config.secrets import child_env
from miles.mlflow_ui.app import APP_NAME, MODEL_TRAINING, WORKFLOW_TYPE_PARAM
from miles.record.layout import RunLayout
from miles.serving.process import free_port, log_tail, wait_healthy

DEFAULT_PORT = 5000  # `mlflow ui`'s own default, so a printed link and a typed command agree
START_TIMEOUT_S = 120.0


def is_server_uri(uri: str) -> bool:
    """A tracking server has its own UI; a SQLite or file store needs `mlflow ui` to be browsed."""
    return uri.startswith(("http://", "https://"))


def ui_args(uri: str, port: int = DEFAULT_PORT) -> list[str]:
    """`mlflow ui`'s arguments, the same for the command printed and the one `start_ui` runs: one worker
    (MLflow's default of 4, on a small machine that also trains, takes a minute to serve its first page)."""
    return ["ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--app-name", APP_NAME]


# MLflow's server also starts a job runner and two huey consumers for its GenAI jobs (judges, trace roll-ups):
# three more Python processes, ~28 CPU-s in the UI's first 40 s against ~8 s without them (measured on a
# 2-core machine), on a machine that is training. Browsing training runs needs none of it.
JOB_EXECUTION_ENV = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"


def ui_env(environ) -> dict[str, str]:
    """The environment `start_ui` gives `mlflow ui`: no secret-named variable, and MLflow's job execution off
    unless the user turned it on."""
    env = child_env(dict(environ))
    env.setdefault(JOB_EXECUTION_ENV, "false")
    return env


def ui_command(uri: str, port: int = DEFAULT_PORT) -> str:
    from miles.config.commands import runnable

    return " ".join([runnable("mlflow"), *ui_args(uri, port)])


def page_url(base: str, experiment_id: str, run_id: str | None = None) -> str:
    """An experiment's (or a run's) page that opens in the model-training view in any MLflow 3.17 UI,
    a tracking server's or a plain `mlflow ui`'s, whatever the browser chose before."""
    path = f"/#/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    return f"{base.rstrip('/')}{path}?{WORKFLOW_TYPE_PARAM}={MODEL_TRAINING}"


def mlflow_link(config: MilesConfig, run_dir: Path, ui_url: str | None = None) -> str | None:
    """The MLflow run's page of a run, in the model-training view: on the tracking server, or in
    `mlflow ui` over the run's SQLite store (`ui_url`, default the address `mlflow ui` takes unless
    told otherwise). None: no MLflow, or no run of it yet."""
    tracking = config.tracking
    if not tracking.use_mlflow:
        return None
    import mlflow

    uri = tracking.mlflow_tracking_uri
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(tracking.mlflow_experiment_name)
    if experiment is None:
        return None
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"],
                              max_results=50)
    names = (tracking.mlflow_run_name, run_dir.name)
    mine = [r for r in runs if r.info.run_name in names] or runs[:1]
    if not mine:
        return None
    base = uri if is_server_uri(uri) else ui_url or f"http://127.0.0.1:{DEFAULT_PORT}"
    return page_url(base, experiment.experiment_id, mine[0].info.run_id)


def mlflow_link_description(config: MilesConfig) -> str:
    """The caption of a link to the MLflow run: a local store (SQLite or files) has no UI until one
    serves it, so the caption says how, with the command whose address the link points at."""
    uri = config.tracking.mlflow_tracking_uri
    if is_server_uri(uri) or config.tracking.mlflow_ui:  # a tracking server, or `--mlflow-ui`'s UI
        return f"the MLflow run of {config.train.run_dir}"
    return f"the MLflow run of {config.train.run_dir}; serve its store first: {ui_command(uri)}"


def check_app_installed() -> None:
    """`mlflow ui --app-name miles` finds the app through miles' installed entry points, not the import path."""
    from mlflow.utils.plugins import get_entry_points

    if APP_NAME not in {e.name for e in get_entry_points("mlflow.app")}:
        raise RuntimeError(f"--mlflow-ui: MLflow does not know the `{APP_NAME}` app (the `mlflow.app` entry point "
                           "of miles' package metadata): install miles with `pip install -e .`")


@dataclass(frozen=True)
class MlflowUi:
    url: str
    pid: int
    log_path: Path


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def start_ui(uri: str, run_dir: Path, timeout: float = START_TIMEOUT_S) -> MlflowUi:
    """Start `mlflow ui --app-name miles` over `uri` on 127.0.0.1 (port 5000 when free) in its own session,
    so it outlives the run for browsing; return once it answers /health."""
    check_app_installed()
    port = DEFAULT_PORT if _port_free(DEFAULT_PORT) else free_port()
    log_path = RunLayout(run_dir).log("mlflow-ui.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "mlflow", *ui_args(uri, port)]
    with open(log_path, "ab") as log:
        # It serves a local store: no secret-named variable of the run is needed there.
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, env=ui_env(os.environ))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout, process=process, path="/health")
    except Exception as exc:
        process.kill()
        process.wait()
        raise RuntimeError(f"--mlflow-ui: `mlflow ui` did not start ({exc}); log {log_path}:\n"
                           f"{log_tail(log_path)}") from None
    return MlflowUi(url=url, pid=process.pid, log_path=log_path)
