"""The MLflow run a journal was already delivered to, when the delivery state that named it is gone.

`tracking/delivery.json` keeps each tracker's run id; without it (deleted, a copy of the run dir made
without it) `miles replay-spool` opened a new MLflow run and delivered every line again: the run held
twice, as two runs (probe DD1). Before a new run is made, the runs of the experiment with the trainer's
run name, or this run dir's `miles.run_dir` tag, are looked at: one holding the journal's first point
(the same key, step and timestamp: each point carries its journal line's own time) is the run the lines
went to, and replay-spool delivers to it (a line delivered again is the same point, not a second one).
"""
from __future__ import annotations

from typing import Any

from miles.record.journal import JournalLine
from miles.record.names import step_of

MAX_CANDIDATES = 50  # runs looked at per filter: runs of one name in one experiment are few
LINES_LOOKED_AT = 5  # journal lines searched for one with a charted metric


def _quoted(value: str) -> str | None:
    """`value` as an MLflow filter string literal; None when it holds a quote (not searched by it)."""
    return None if "'" in value or "\\" in value else f"'{value}'"


def _first_point(lines: list[JournalLine]) -> tuple[str, int, int] | None:
    """(key, step, timestamp in ms) of the journal's first charted point, as MlflowSink logs it."""
    from miles.tracking.sinks.mlflow_sink import charted_in_mlflow

    for line in lines[:LINES_LOOKED_AT]:
        for key in sorted(charted_in_mlflow(line.metrics)):
            return key, step_of(key, line.metrics, line.rollout_id), int(line.time * 1000)
    return None


def delivered_run(options: dict[str, Any], lines: list[JournalLine]) -> str | None:
    """The id of a run of `options`' experiment that already holds the journal's first point, found by
    the run name or the `miles.run_dir` tag of `options`; None when there is none."""
    from mlflow.tracking import MlflowClient

    point = _first_point(lines)
    client = MlflowClient(tracking_uri=options["tracking_uri"])
    experiment = client.get_experiment_by_name(options["experiment"]) if point else None
    if experiment is None:
        return None
    key, step, timestamp = point
    filters = []
    if options.get("run_name") and (name := _quoted(options["run_name"])):
        filters.append(f"attributes.run_name = {name}")
    if (options.get("tags") or {}).get("miles.run_dir") and (where := _quoted(options["tags"]["miles.run_dir"])):
        filters.append(f"tags.`miles.run_dir` = {where}")
    for text in filters:
        for run in client.search_runs([experiment.experiment_id], text, max_results=MAX_CANDIDATES):
            history = client.get_metric_history(run.info.run_id, key)
            if any(m.step == step and m.timestamp == timestamp for m in history):
                return run.info.run_id
    return None
