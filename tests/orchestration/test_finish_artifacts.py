"""The finished run's artifacts read well: grpo-final-metrics rounded, headline metrics first, the base eval
beside the final one; the grpo-mlflow-run link says how to serve a local store before it can be opened."""
from __future__ import annotations

from miles.config import parse_config
from miles.prepare import resolve_run
from miles.mlflow_ui.launch import mlflow_link_description
from miles.run.scorecard import final_metrics_table

FINAL = {"health/entropy_loss": 0.0, "perf/step_time": 3.81234, "train/loss": 4.7e-09, "rollout/step": 59.0,
         "train/step": 59.0, "eval/step": 59.0, "rollout/raw_reward": 0.908854166666667,
         "eval/arithmetic-pass_at_1": 0.796875, "passrate/pass_at_4": 0.96875, "custom/thing": 2.0,
         "train/grad_norm": float("nan")}


def test_final_metrics_are_rounded_ordered_and_beside_the_base_eval():
    rows = final_metrics_table(FINAL, {"eval/arithmetic-pass_at_1": 0.229166666, "eval/step": 0.0})
    assert [r["metric"] for r in rows] == [
        "eval/arithmetic-pass_at_1", "rollout/raw_reward", "passrate/pass_at_4", "train/grad_norm", "train/loss",
        "perf/step_time", "custom/thing", "health/entropy_loss"]  # no step axes; the health zeros last
    by_key = {r["metric"]: r for r in rows}
    assert by_key["eval/arithmetic-pass_at_1"] == {"metric": "eval/arithmetic-pass_at_1", "final": 0.7969,
                                                   "base": 0.2292}
    assert by_key["rollout/raw_reward"]["final"] == 0.9089 and by_key["rollout/raw_reward"]["base"] == ""
    assert by_key["train/loss"]["final"] == 4.7e-09  # small values keep their digits
    assert by_key["train/grad_norm"]["final"] == "nan"  # said, not a JSON NaN


def test_the_mlflow_link_of_a_local_store_says_to_serve_it_first(tmp_path):
    local = resolve_run(parse_config(["--use-mlflow", "--run-dir", str(tmp_path / "r")]))
    text = mlflow_link_description(local)
    assert "serve its store first:" in text
    assert f"ui --backend-store-uri {local.tracking.mlflow_tracking_uri} --host 127.0.0.1 --port 5000" in text
    server = resolve_run(parse_config(["--use-mlflow", "--run-dir", str(tmp_path / "s"),
                                       "--mlflow-tracking-uri", "http://mlflow.example:5000"]))
    assert "serve" not in mlflow_link_description(server)  # a tracking server has its own UI
