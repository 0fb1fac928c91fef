"""Probe DD1: a run dir whose `tracking/delivery.json` is gone (deleted, or a copy made without it):
`miles replay-spool` made a second MLflow run and delivered every journal line to it again. Now the run
the lines already went to (the trainer's run name or the run dir's tag, confirmed by the journal's first
point) gets them, and no run is added."""
from __future__ import annotations

import json
from pathlib import Path

from .spooled_runs import replay_spool


def mlflow_runs(store: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def test_a_lost_delivery_state_reattaches_to_the_run_that_holds_the_lines(run_copy, finished_run):
    store = run_copy.parent / "mlflow.db"
    before = mlflow_runs(store)
    delivered = json.loads((run_copy / "tracking" / "delivery.json").read_text())
    (run_copy / "tracking" / "delivery.json").unlink()
    done = replay_spool(run_copy, "--allow-dir", str(finished_run.parent))  # the copied store's artifacts
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    after = mlflow_runs(store)
    assert len(after) == len(before), [r.info.run_name for r in after]
    run_id = json.loads((run_copy / "tracking" / "delivery.json").read_text())["sinks"]["mlflow"]["spec"]["options"]
    assert run_id["run_id"] == delivered["sinks"]["mlflow"]["spec"]["options"]["run_id"]
    assert "already holds this journal's lines" in (run_copy / "tracking" / "delivery.log").read_text()
    assert {r.info.run_id: r for r in after}[run_id["run_id"]].info.status == "FINISHED"


def test_a_new_journal_in_a_reused_run_dir_gets_a_new_run(run_copy, finished_run):
    """Only a run holding this journal's own first point is reattached: a run dir emptied and used again
    (a new journal, new times) still gets a run of its own."""
    store = run_copy.parent / "mlflow.db"
    before = mlflow_runs(store)
    (run_copy / "tracking" / "delivery.json").unlink()
    journal = run_copy / "metrics.jsonl"
    rows = [json.loads(line) for line in journal.read_text().splitlines()]
    journal.write_text("".join(json.dumps({**r, "time": r["time"] + 86400.0}) + "\n" for r in rows))
    done = replay_spool(run_copy, "--allow-dir", str(finished_run.parent))  # the copied store's artifacts
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert len(mlflow_runs(store)) == len(before) + 1
