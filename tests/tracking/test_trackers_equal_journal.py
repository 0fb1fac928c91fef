"""All trackers on, a full synthetic run: MLflow, wandb offline and TensorBoard each hold
exactly the journal's keys, steps and values; the artifacts are stored."""
from __future__ import annotations

import json

from tracking_helpers import ALL_TRACKERS, assert_all_trackers_equal_journal, run_synthetic

from miles.record.journal import read_journal
from miles.record.names import STEP_KEYS
from miles.tracking.state import DeliveryState, recorded_lines


def test_every_tracker_equals_the_journal(run_dir):
    proc = run_synthetic(run_dir, "--rollouts", "6", "--save-interval", "2", *ALL_TRACKERS,
                         "--log-samples-interval", "2")
    assert "undelivered={}" in proc.stdout
    points = assert_all_trackers_equal_journal(run_dir)
    # mapped once, the same everywhere: MLflow would reject `@`
    assert "passrate/pass_at_4" in points and not any("@" in k for k in points)
    # 6 rollouts, rollout/step 0..5, train/step 1,3,..,11 (2 optimizer steps per rollout), eval at 0 and 3
    assert points["rollout/step"] == [(i, float(i)) for i in range(6)]
    assert [s for s, _ in points["train/loss"]] == [1, 3, 5, 7, 9, 11]
    assert [s for s, _ in points["eval/arith"]] == [0, 3]
    lines = read_journal(run_dir / "metrics.jsonl")
    assert [ln.rollout_id for ln in lines] == list(range(6))
    state = DeliveryState.load(run_dir)
    assert recorded_lines(run_dir) == 6 and all(s.cursor == 6 and s.uploaded for s in state.sinks.values())


def test_mlflow_run_has_params_artifacts_and_samples(run_dir):
    from mlflow.tracking import MlflowClient

    run_synthetic(run_dir, "--rollouts", "4", "--use-mlflow", "--log-samples-interval", "2")
    spec = DeliveryState.load(run_dir).sinks["mlflow"].spec.options
    assert spec["tracking_uri"] == f"sqlite:///{run_dir.resolve().parent}/mlflow.db"  # shared by the runs beside it
    client = MlflowClient(tracking_uri=spec["tracking_uri"])
    run = client.get_run(spec["run_id"])
    assert client.get_experiment(run.info.experiment_id).name == "miles"
    assert run.info.status == "FINISHED"
    assert run.data.params["num_rollout"] == "4" and run.data.params["use_mlflow"] == "True"
    # the step axes are each point's step, not charts of their own (F3 of the first-hour review)
    assert "train/loss" in run.data.metrics and not set(STEP_KEYS) & set(run.data.metrics)
    names = {a.path for a in client.list_artifacts(spec["run_id"])}
    assert {"config.yaml", "metrics.jsonl", "report.png", "samples"} <= names
    samples = {a.path for a in client.list_artifacts(spec["run_id"], "samples")}
    # every --log-samples-interval-th rollout and the last one (the final policy's samples), each with its table
    assert samples == {f"samples/rollout_{i:06d}.{kind}" for i in (0, 2, 3) for kind in ("jsonl", "table.json")}
    row = json.loads((run_dir / "samples" / "rollout_000002.jsonl").read_text().splitlines()[0])
    assert row["prompt"] == "2+10=" and row["reward"] in (0.0, 1.0) and "response" in row
    assert row["rollout_log_probs"] == [-0.5, -1.0, -0.25]
    # the table artifact: MLflow's split format, one row per sample, logged once (and listed as a table)
    table = json.loads(open(client.download_artifacts(spec["run_id"], "samples/rollout_000002.table.json")).read())
    cells = [dict(zip(table["columns"], r)) for r in table["data"]]
    assert len(cells) == 8 and cells[0]["prompt"] == "2+10=" and cells[0]["log_probs"] == "[-0.5, -1.0, -0.25]"
    assert abs(cells[1]["log_prob_mean"] - (-0.5 - 2.0 - 0.25) / 3) < 1e-9 and {c["reward"] for c in cells} <= {0.0, 1.0}
    assert {"path": "samples/rollout_000002.table.json", "type": "table"} in \
        json.loads(run.data.tags["mlflow.loggedArtifacts"])


def test_wandb_table_config_and_step_axes(run_dir):
    from miles.tracking.wandb_files import read_offline_run

    run_synthetic(run_dir, "--rollouts", "3", "--use-wandb", "--log-samples-interval", "2",
                  "--wandb-group", "g1")
    spec = DeliveryState.load(run_dir).sinks["wandb"].spec.options
    assert spec["mode"] == "offline"  # no key in the environment
    run = read_offline_run(run_dir, spec["run_id"])
    assert run.config["num_rollout"] == 3 and run.config["wandb_group"] == "g1"
    with_table = [i for i, row in enumerate(run.history) if "rollout/samples/_type" in row]
    assert with_table == [0, 2] and run.history[0]["rollout/samples/nrows"] == 8
    table = next(run_dir.glob("wandb/offline-run-*/files/media/table/rollout/samples_0_*.table.json"))
    data = json.loads(table.read_text())
    assert "log_probs" in data["columns"] and "log_prob_mean" in data["columns"] and len(data["data"]) == 8
    files = next(run_dir.glob("wandb/offline-run-*")) / "files"
    assert {"config.yaml", "metrics.jsonl", "report.png"} <= {p.name for p in files.iterdir()}
