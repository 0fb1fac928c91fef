"""What `miles train` prints: where to watch the run, and what it left behind."""
from __future__ import annotations

from pathlib import Path

from flows.prefect_server import PrefectServer
from miles.config import MilesConfig
from miles.dashboard.cli import command as dashboard_command
from miles.mlflow_ui.launch import MlflowUi, is_server_uri, ui_command
from miles.config.commands import runnable
from miles.record.layout import RunLayout
from miles.run.scorecard import scorecard


def mlflow_ui_command(config: MilesConfig) -> str:
    uri = config.tracking.mlflow_tracking_uri
    return f"open {uri}" if is_server_uri(uri) else ui_command(uri)


def where_to_look(config: MilesConfig, server: PrefectServer, ui: MlflowUi | None = None) -> list[tuple[str, str]]:
    """`config` is resolved: every path in it is absolute."""
    run_dir = Path(config.train.run_dir)
    rows = [("Prefect UI", server.ui_url), ("run dir", str(run_dir)),
            ("journal", str(RunLayout(run_dir).journal)), ("dashboard", dashboard_command(run_dir))]
    if config.tracking.use_mlflow:
        rows.append(("MLflow", f"{ui.url}  (mlflow ui, pid {ui.pid}; stop it with `kill {ui.pid}`)" if ui
                     else mlflow_ui_command(config)))
    if config.tracking.use_wandb:
        files = Path(config.tracking.wandb_dir) / "wandb"
        # each chunk's process writes its own offline-run-* folder of the one run id: sync them together
        rows.append(("wandb", str(files) if config.tracking.wandb_mode == "online" else
                     f"offline: {runnable('wandb')} sync {files}/offline-run-*  (one run; a folder per chunk)"))
    if config.tracking.use_tensorboard:
        rows.append(("TensorBoard", f"{runnable('tensorboard')} --logdir {config.tracking.tensorboard_dir}"))
    else:
        rows.append(("TensorBoard", "off (--use-tensorboard writes event files to RUN_DIR/tensorboard)"))
    return rows


def print_where_to_look(config: MilesConfig, server: PrefectServer, ui: MlflowUi | None = None) -> None:
    rows = where_to_look(config, server, ui)
    width = max(len(name) for name, _ in rows)
    print("miles train: where to look", flush=True)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}", flush=True)
    print("  (the Prefect UI's Deployments page stays empty until `make deploy` registers the scheduled runs of "
          "this flow: docs/user-guide/orchestration.md)", flush=True)
    if server.started_here:
        print(f"  (started a local Prefect server, pid {server.pid}, state in {server.home}; it stays up for the UI "
              f"and the next run reuses it: stop it with `kill {server.pid}`)")


def finished_steps(report, server: PrefectServer, config: MilesConfig, ui: MlflowUi | None = None) -> list[tuple[str, str]]:
    """The scorecard's "where to look next" rows: runnable commands and the links the run left."""
    run_dir = Path(report.run_dir)
    steps = [("health", f"{runnable('miles')} doctor {run_dir}"),
             ("dashboard", dashboard_command(run_dir).removesuffix(" --follow"))]
    if "prefect-training-run" in report.links:
        steps.append(("Prefect", f"{report.links['prefect-training-run']}  (the run that trains)"))
    else:
        steps.append(("Prefect", f"{server.ui_url}/runs"))
    if "mlflow-run" in report.links:
        served = ui is not None or is_server_uri(config.tracking.mlflow_tracking_uri)
        steps.append(("MLflow", report.links["mlflow-run"]
                      + ("" if served else f"  (serve it first: {mlflow_ui_command(config)})")))
    if "traces" in report.links:
        steps.append(("traces", report.links["traces"]))
    return steps


def print_finished(report, server: PrefectServer, config: MilesConfig, ui: MlflowUi | None = None,
                   seconds: float | None = None) -> None:
    """The run's scorecard, read back from its run dir (`seconds`: the wall time `miles train` measured)."""
    card = scorecard(report.run_dir, config.train.save, seconds, finished_steps(report, server, config, ui))
    print(card.text("miles train: scorecard"), flush=True)
