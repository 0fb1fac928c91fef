"""A training chunk ends with `close(final=False)`: its journal lines are delivered and the tracker
run finished, but the report and artifacts wait for the run's last close; the next chunk continues
the same tracker run."""
from __future__ import annotations

from mlflow.tracking import MlflowClient

from miles.config import parse_config
from miles.tracking import open_tracking
from miles.tracking.state import DeliveryState


def chunk(run_dir, rollouts: range, final: bool):
    config = parse_config(["--num-rollout", "4", "--use-mlflow"])
    tracker = open_tracking(config, run_dir)
    state = DeliveryState.load(run_dir)
    extra = {"mlflow_run_id": state.sinks["mlflow"].spec.options["run_id"]} if "mlflow" in state.sinks else {}
    tracker.open(extra)
    for rollout_id in rollouts:
        tracker.record(rollout_id, {"train/loss": 1.0 / (rollout_id + 1), "rollout/step": float(rollout_id),
                                    "train/step": float(rollout_id)})
    report = tracker.close(final=final)
    assert report == {}
    return DeliveryState.load(run_dir).sinks["mlflow"]


def test_intermediate_close_delivers_but_keeps_the_report_for_the_end(run_dir):
    first = chunk(run_dir, range(0, 2), final=False)
    client = MlflowClient(tracking_uri=first.spec.options["tracking_uri"])
    run_id = first.spec.options["run_id"]
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == [0, 1]
    assert client.list_artifacts(run_id) == [] and not (run_dir / "report.png").exists()
    assert not first.uploaded  # replay-spool would still owe the final upload

    last = chunk(run_dir, range(2, 4), final=True)
    assert last.spec.options["run_id"] == run_id and last.uploaded
    assert sorted(m.step for m in client.get_metric_history(run_id, "train/loss")) == [0, 1, 2, 3]
    assert {"report.png", "metrics.jsonl", "config.yaml"} <= {a.path for a in client.list_artifacts(run_id)}
    assert client.get_run(run_id).info.status == "FINISHED"
