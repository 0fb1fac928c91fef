"""What `miles train` prints: where to watch the run, and what it left behind."""
from __future__ import annotations

from pathlib import Path

from flows.prefect_server import PrefectServer
from miles.config import MilesConfig
from miles.dashboard.cli import command as dashboard_command


def mlflow_ui_command(config: MilesConfig, run_dir: Path) -> str:
    uri = config.tracking.mlflow_tracking_uri or f"sqlite:///{run_dir / 'mlflow.db'}"
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    return f"mlflow ui --backend-store-uri {uri}"


def where_to_look(config: MilesConfig, server: PrefectServer) -> list[tuple[str, str]]:
    run_dir = Path(config.train.run_dir).resolve()
    rows = [("Prefect UI", server.ui_url), ("run dir", str(run_dir)),
            ("journal", str(run_dir / "metrics.jsonl")), ("dashboard", dashboard_command(run_dir))]
    if config.tracking.use_mlflow:
        rows.append(("MLflow", mlflow_ui_command(config, run_dir)))
    if config.tracking.use_wandb:
        rows.append(("wandb", str(Path(config.tracking.wandb_dir or run_dir).resolve() / "wandb")
                     + ("" if config.tracking.wandb_mode == "online" else "  (offline: `wandb sync` it)")))
    return rows


def print_where_to_look(config: MilesConfig, server: PrefectServer) -> None:
    rows = where_to_look(config, server)
    width = max(len(name) for name, _ in rows)
    print("miles train: where to look")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    if server.started_here:
        print(f"  (started a local Prefect server, pid {server.pid}, state in {server.home}; it stays up for the UI "
              f"and the next run reuses it: stop it with `kill {server.pid}`)")


def print_finished(report, server: PrefectServer) -> None:
    shown = {k: report.final_metrics[k] for k in sorted(report.final_metrics) if "/" in k}
    print(f"miles train: finished {report.iterations} rollouts in {report.run_dir}")
    for key, value in list(shown.items())[:12]:
        print(f"  {key:<32} {value:.4g}")
    for key, url in report.links.items():
        print(f"  {key}: {url}")
    print(f"  red flags: {len(report.red_flags)}; flow runs: {server.ui_url}/runs")
