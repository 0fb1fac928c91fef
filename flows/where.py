"""What `miles train` prints: where to watch the run, and what it left behind."""
from __future__ import annotations

from pathlib import Path

from flows.prefect_server import PrefectServer
from miles.config import MilesConfig
from miles.dashboard.cli import command as dashboard_command
from miles.mlflow_ui.launch import MlflowUi, is_server_uri, ui_command
from miles.config.commands import runnable
from miles.record.layout import RunLayout
from miles.run.scorecard import Scorecard
from miles.train import next_steps


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


def finished_steps(card: Scorecard, server: PrefectServer, config: MilesConfig,
                   ui: MlflowUi | None = None) -> list[tuple[str, str]]:
    """The scorecard's "where to look next" rows: the plain driver's (`miles.train.next_steps`) with
    the Prefect run that trained (or the server's runs) after the dashboard's."""
    trained = card.links.get("prefect-training-run")
    prefect = f"{trained}  (the run that trains)" if trained else f"{server.ui_url}/runs"
    return next_steps(config, card.links, ui_running=ui is not None, views=[("Prefect", prefect)])


def print_finished(card: Scorecard, server: PrefectServer, config: MilesConfig,
                   ui: MlflowUi | None = None) -> None:
    """The run's scorecard (finish_run's, or read back when the run stopped), where to look next."""
    card.next_steps = finished_steps(card, server, config, ui)
    print(card.text("miles train: scorecard"), flush=True)
