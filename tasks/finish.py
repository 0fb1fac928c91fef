"""Finish a run: stop the training ranks and publish the scorecard's parts as artifacts (each chunk
already closed the trackers, which writes the run report and uploads it)."""
from __future__ import annotations

import time
from pathlib import Path

from prefect import task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

from miles.backends.group import stop_named_group
from miles.compare.comparison import format_markdown
from miles.compare.run_end import compare_at_end
from miles.config import MilesConfig
from miles.config.run_info import describe
from miles.mlflow_ui.launch import mlflow_link, mlflow_link_description
from miles.profiling.window import trace_root
from miles.record.layout import has_traces
from miles.run.scorecard import Scorecard, final_metrics_table, red_flags_markdown, scorecard
from miles.tracking.run_description import describe_mlflow_run
from tasks.logs import library_logs_to_prefect
from tasks.training import RunServices


@task(name="finish_run", log_prints=True)
def finish_run(config: MilesConfig, services: RunServices,
               started_at: float | None = None) -> Scorecard:
    """Ranks stopped cleanly, then the scorecard, read once, published: the final-metrics table, the
    links, the health and scorecard artifacts, and the MLflow run's description. `started_at`: when
    the flow started (the wall time). Returns the card with its links."""
    run_dir = config.train.run_dir
    path = Path(run_dir)
    with library_logs_to_prefect():
        stop_named_group(services.names, config.world_size)
    seconds = None if started_at is None else time.time() - started_at
    card = scorecard(path, config.train.save, seconds)
    last = f" (rollout {card.final_rollout})" if card.final_rollout is not None else ""
    create_table_artifact(key="grpo-final-metrics",
                          table=final_metrics_table(card.final_metrics, card.base_metrics),
                          description=f"final metrics of {run_dir}{last}, beside the base eval's")
    card.links = run_links(config, path)
    for key, url in card.links.items():
        create_link_artifact(key=f"grpo-{key}", link=url, description=mlflow_link_description(config)
                             if key == "mlflow-run" else f"{key} of {run_dir}")
    create_markdown_artifact(key="grpo-health",
                             markdown=red_flags_markdown(card.flags.lines, card.flags.warnings),
                             description="the health watch's red flags (RUN_DIR/health.jsonl)")
    create_markdown_artifact(key="grpo-scorecard", markdown=card.markdown(),
                             description=f"base -> final eval, reward, time, red flags, model of {run_dir}")
    if config.tracking.use_mlflow:
        describe_mlflow_run(path, config.tracking.mlflow_tracking_uri, describe(config, path), card.markdown())
    with library_logs_to_prefect():
        compared = compare_at_end(config)  # with --baseline-run-dirs: printed, and the MLflow run tagged
    if compared is not None:
        create_markdown_artifact(key="grpo-compare", markdown=format_markdown(compared),
                                 description=f"{run_dir} against its baselines (miles compare)")
    return card


def run_links(config: MilesConfig, run_dir: Path) -> dict[str, str]:
    """What the run left elsewhere: its MLflow run's page, and the profiler's traces
    (RUN_DIR/profiler unless --tensorboard-dir; every run leaves its pids there, not a trace)."""
    links = {}
    if (mlflow_url := mlflow_link(config, run_dir)) is not None:
        links["mlflow-run"] = mlflow_url
    traces = trace_root(config, run_dir)
    if has_traces(traces):
        links["traces"] = traces.resolve().as_uri()
    return links
