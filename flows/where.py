"""What `miles train` prints: where to watch the run, and what it left behind."""
from __future__ import annotations

from pathlib import Path

from flows.prefect_server import PrefectServer
from miles.config import MilesConfig
from miles.dashboard.cli import command as dashboard_command
from miles.mlflow_ui.launch import MlflowUi, is_server_uri, ui_command
from miles.record.layout import RunLayout


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
        rows.append(("wandb", str(Path(config.tracking.wandb_dir) / "wandb")
                     + ("" if config.tracking.wandb_mode == "online" else "  (offline: `wandb sync` it)")))
    return rows


def print_where_to_look(config: MilesConfig, server: PrefectServer, ui: MlflowUi | None = None) -> None:
    rows = where_to_look(config, server, ui)
    width = max(len(name) for name, _ in rows)
    print("miles train: where to look")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    if server.started_here:
        print(f"  (started a local Prefect server, pid {server.pid}, state in {server.home}; it stays up for the UI "
              f"and the next run reuses it: stop it with `kill {server.pid}`)")


def print_finished(report, server: PrefectServer, config: MilesConfig, ui: MlflowUi | None = None) -> None:
    shown = {k: report.final_metrics[k] for k in sorted(report.final_metrics) if "/" in k}
    print(f"miles train: finished {report.iterations} rollouts in {report.run_dir}")
    for key, value in list(shown.items())[:12]:
        print(f"  {key:<32} {value:.4g}")
    for key, url in report.links.items():
        print(f"  {key}: {url}")
        if key == "mlflow-run" and ui is None and not is_server_uri(config.tracking.mlflow_tracking_uri):
            print(f"    (serve it first: {mlflow_ui_command(config)})")
    print(f"  red flags: {len(report.red_flags)}; flow runs: {server.ui_url}/runs")
