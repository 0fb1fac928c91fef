"""Finish a run: stop the training ranks and publish the artifacts (each chunk already closed the trackers,
which writes the run report and uploads it)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from prefect import task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

from miles.backends.group import stop_named_group
from miles.compare.comparison import format_markdown
from miles.compare.run_end import compare_at_end
from miles.config import MilesConfig
from miles.mlflow_ui.launch import DEFAULT_PORT, is_server_uri, page_url, ui_command
from miles.profiling.window import trace_root
from miles.record.journal import read_journal
from miles.record.layout import RunLayout, has_traces
from miles.record.names import STEP_KEYS
from miles.config.run_info import describe
from miles.run.scorecard import base_metrics, red_flags_of, scorecard
from miles.tracking.run_description import describe_mlflow_run
from tasks.logs import library_logs_to_prefect
from tasks.training import RunServices


@dataclass(frozen=True)
class RunReport:
    """What a finished run leaves behind and where to look at it."""

    run_dir: str
    iterations: int
    final_metrics: dict[str, float] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    red_flags: list[str] = field(default_factory=list)
    seconds: float | None = None  # the scorecard's wall time (miles.run.scorecard.WALL_TIME), as finish_run made it


def mlflow_link(config: MilesConfig, run_dir: Path, ui_url: str | None = None) -> str | None:
    """The MLflow run's page, in the model-training view: on the tracking server, or in `mlflow ui` over the
    run's SQLite store (`ui_url`, default the address `mlflow ui` takes unless told otherwise)."""
    tracking = config.tracking
    if not tracking.use_mlflow:
        return None
    import mlflow

    uri = tracking.mlflow_tracking_uri
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(tracking.mlflow_experiment_name)
    if experiment is None:
        return None
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"], max_results=50)
    mine = [r for r in runs if r.info.run_name in (tracking.mlflow_run_name, run_dir.name)] or runs[:1]
    if not mine:
        return None
    base = uri if is_server_uri(uri) else ui_url or f"http://127.0.0.1:{DEFAULT_PORT}"
    return page_url(base, experiment.experiment_id, mine[0].info.run_id)


FINAL_ORDER = ("eval", "rollout", "passrate", "train", "multi_turn", "perf")  # then the rest; health/* last


def _rounded(value: float) -> float | str:
    """Four significant digits (a table of 0.908854166666667 is unreadable); not finite: its name."""
    return float(f"{value:.4g}") if math.isfinite(value) else str(value)


def final_metrics_table(final: dict[str, float], base: dict[str, float]) -> list[dict[str, float | str]]:
    """The `grpo-final-metrics` rows: the headline namespaces first (eval, reward, pass rates, train), perf and
    the health watch's per-signal values last, each value rounded; an eval key measured on the starting
    weights too has that `base` value beside it. The step axes are left out (the description names the rollout)."""
    def order(key: str) -> tuple[int, str]:
        namespace = key.split("/", 1)[0]
        rank = FINAL_ORDER.index(namespace) if namespace in FINAL_ORDER else \
            len(FINAL_ORDER) + (namespace == "health")
        return rank, key

    return [{"metric": key, "final": _rounded(final[key]),
             "base": _rounded(base[key]) if key in base else ""}
            for key in sorted((k for k in final if k not in STEP_KEYS), key=order)]


def mlflow_link_description(config: MilesConfig) -> str:
    """The `grpo-mlflow-run` caption: a local store (SQLite or files) has no UI until one serves it, so the
    link says how, with the command whose address it points at."""
    uri = config.tracking.mlflow_tracking_uri
    if is_server_uri(uri) or config.tracking.mlflow_ui:  # a tracking server, or the UI `--mlflow-ui` started
        return f"the MLflow run of {config.train.run_dir}"
    return f"the MLflow run of {config.train.run_dir}; serve its store first: {ui_command(uri)}"


def red_flags_markdown(flags: list[str], warnings: list[str] = ()) -> str:
    text = "## Health: red flags\n\n" + "\n".join(f"- {flag}" for flag in flags) if flags else \
        "## Health\n\nNo red flags."
    if warnings:
        text += "\n\nWarnings: " + ", ".join(f"`{w}`" for w in warnings)
    return text


@task(name="finish_run", log_prints=True)
def finish_run(config: MilesConfig, services: RunServices, started_at: float | None = None) -> RunReport:
    """Ranks stopped cleanly, then the scorecard (an artifact, and the MLflow run's description), the
    final-metrics table, link and health artifacts. `started_at`: when the flow started (the wall time)."""
    run_dir = config.train.run_dir
    path = Path(run_dir)
    with library_logs_to_prefect():
        stop_named_group(services.names, config.world_size)
    journal = read_journal(RunLayout(path).journal)
    final = dict(journal[-1].metrics) if journal else {}
    base = base_metrics(path, journal)
    last = f" (rollout {journal[-1].rollout_id})" if journal else ""
    create_table_artifact(key="grpo-final-metrics", table=final_metrics_table(final, base),
                          description=f"final metrics of {run_dir}{last}, beside the base eval's")
    links = {}
    if (mlflow_url := mlflow_link(config, path)) is not None:
        links["mlflow-run"] = mlflow_url
    traces = trace_root(config, path)  # the profiler's traces (RUN_DIR/profiler unless --tensorboard-dir)
    if has_traces(traces):  # every run leaves its pids there; that is not a trace
        links["traces"] = traces.resolve().as_uri()
    for key, url in links.items():
        create_link_artifact(key=f"grpo-{key}", link=url, description=mlflow_link_description(config)
                             if key == "mlflow-run" else f"{key} of {run_dir}")
    health = red_flags_of(journal, path)  # what the scorecard reads too
    flags = health.lines
    create_markdown_artifact(key="grpo-health", markdown=red_flags_markdown(flags, health.warnings),
                             description="the health watch's red flags (RUN_DIR/health.jsonl)")
    card = scorecard(path, config.train.save, None if started_at is None else time.time() - started_at)
    create_markdown_artifact(key="grpo-scorecard", markdown=card.markdown(),
                             description=f"base -> final eval, reward, time, red flags, model of {run_dir}")
    if config.tracking.use_mlflow:
        describe_mlflow_run(path, config.tracking.mlflow_tracking_uri, describe(config, path), card.markdown())
    with library_logs_to_prefect():
        compared = compare_at_end(config)  # with --baseline-run-dirs: printed, and the MLflow run tagged
    if compared is not None:
        create_markdown_artifact(key="grpo-compare", markdown=format_markdown(compared),
                                 description=f"{run_dir} against its baselines (miles compare)")
    iterations = len({ln.rollout_id for ln in journal if ln.rollout_id >= 0})  # not the base eval's line
    return RunReport(run_dir=run_dir, iterations=iterations, final_metrics=final, links=links, red_flags=flags,
                     seconds=card.seconds)
