"""A finished run's description on its MLflow run (`mlflow.note.content`, the run page's "Description"):
the line written when the run was created, followed by the run's scorecard, set once the run is over."""
from __future__ import annotations

import logging
from pathlib import Path

from miles.tracking.sinks.mlflow_sink import DESCRIPTION_TAG
from miles.tracking.state import DeliveryState, StateError

log = logging.getLogger("miles.tracking")


def mlflow_run_id(run_dir: Path) -> str | None:
    """The MLflow run the run dir's delivery process created (None: MLflow off, or never opened)."""
    try:
        sink = DeliveryState.load(Path(run_dir)).sinks.get("mlflow")
    except (StateError, OSError, ValueError):
        return None
    return sink.spec.options.get("run_id") if sink is not None else None


def describe_mlflow_run(run_dir: Path, tracking_uri: str, first_line: str, body: str) -> bool:
    """Set the MLflow run's description to `first_line` and then `body` (markdown). A tracker that cannot be
    reached never fails the run: it is logged, and False is returned."""
    run_id = mlflow_run_id(run_dir)
    if run_id is None:
        return False
    try:
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=tracking_uri).set_tag(run_id, DESCRIPTION_TAG, f"{first_line}\n\n{body}")
        return True
    except Exception as exc:  # noqa: BLE001 - a tracker outage must not fail a finished run
        log.warning("could not set the MLflow run's description (%s): %s", run_id, exc)
        return False
