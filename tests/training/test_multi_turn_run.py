"""A short multi-turn run of `python -m miles.train`'s loop: log-probs agree over the model's tokens at
rollout 0, `multi_turn/` metrics reach the journal and MLflow on the rollout axis, the stdout row shows
turns, and sample tables carry the conversation and the loss mask."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from miles.config import parse_config
from miles.prepare import prepare_config
from miles.record.journal import read_journal
from miles.train import train

CONFIG = Path(__file__).parents[2] / "configs" / "tiny-multi-turn.yaml"
SHORT = ["--num-rollout", "2", "--rollout-batch-size", "8", "--n-samples-per-prompt", "4", "--eval-interval", "2",
         "--eval-max-prompts", "8", "--log-samples-interval", "1", "--use-mlflow"]


@pytest.mark.slow
def test_multi_turn_run_end_to_end(tmp_path, capsys, ray_cluster):
    run_dir = tmp_path / "run"
    config = parse_config(["--config", str(CONFIG), *SHORT, "--run-dir", str(run_dir)])
    summary = train(prepare_config(config))
    lines = read_journal(run_dir / "metrics.jsonl")
    assert [line.rollout_id for line in lines] == [-1, 0, 1]  # the eval before training, then the iterations
    metrics = [line.metrics for line in lines[1:]]
    # rollout 0: the engines and the trainer hold the same weights; observation tokens are not scored
    assert metrics[0]["train/train_rollout_logprob_abs_diff"] <= 1e-3
    for m in metrics:
        assert 1.0 <= m["multi_turn/round_number_mean"] <= 3.0
        assert "multi_turn/wo_obs_response_length_mean" in m and "multi_turn/tool_use_ratio" in m
    assert "turns=" in capsys.readouterr().out

    rows = [json.loads(t) for t in (run_dir / "samples" / "rollout_000000.jsonl").read_text().splitlines()]
    tokens = {r["index"]: r for r in map(json.loads, (run_dir / "tokens" / "rollout_000000.jsonl").read_text()
                                         .splitlines())}
    with_tool = [r for r in rows if any(t["role"] == "tool" for t in r["turns"])]
    assert with_tool, "no trajectory called the tool in rollout 0"
    for row in with_tool:
        assert row["turns"][0] == {"role": "user", "text": row["prompt"]}
        roles = [m["role"] for m in row["messages"]]
        # a sampled policy may call again (or write a malformed call) before it answers
        assert roles[:3] == ["user", "assistant", "tool"] and set(roles[3:]) <= {"assistant", "tool"}
        assert row["messages"][1]["tool_calls"][0]["function"]["name"] == "calc"
        mask = tokens[row["index"]]["loss_mask"]
        assert 0 in mask and len(mask) == row["response_length"]
    # the common shape: call, result, answer
    assert any([m["role"] for m in r["messages"]] == ["user", "assistant", "tool", "assistant"] for r in with_tool)

    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run_dir.parent / 'mlflow.db'}")  # shared by the runs beside it
    (run,) = [r for r in client.search_runs([client.get_experiment_by_name("miles").experiment_id])
              if r.info.run_name == run_dir.name]
    history = client.get_metric_history(run.info.run_id, "multi_turn/round_number_mean")
    assert sorted(p.step for p in history) == [0, 1]
    assert summary.checkpoint is not None
