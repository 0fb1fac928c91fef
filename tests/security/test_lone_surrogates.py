"""Probes ST1/ST4: one lone surrogate in a sample (a `--prompt-data` label, a hook's response, a tool's
output) made MLflow's sample table fail, which held that journal line and every later one spooled for
good, and made the dashboard's answer for that rollout a 500.

Now a label with one is refused with the prompt file's error, the samples file, the trackers' table
and what the dashboard serves hold valid UTF-8 (U+FFFD in its place), and a sample table that fails
on what it holds never keeps the metrics out of MLflow."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from miles.config import ConfigError
from miles.dashboard.app import build_app
from miles.record.journal import JournalLine
from miles.record.samples import samples_path, write_samples
from miles.rollout.data import read_prompts
from miles.tracking.sinks.base import Delivery
from miles.tracking.sinks.mlflow_sink import MlflowSink

from tests.support.dashboard import RECORDED

LONE = "lone \ud800 surrogate"


def test_a_label_with_a_lone_surrogate_is_refused_as_a_prompt_is(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n" +
                    json.dumps({"prompt": "2+1=", "label": "3\ud800"}) + "\n")
    with pytest.raises(ConfigError, match=r"--prompt-data: .*p.jsonl:2: 'label' holds a lone surrogate"):
        read_prompts(data, "prompt", "label")
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi \udfff"}], "label": "1"}) + "\n")
    with pytest.raises(ConfigError, match=r"chat.jsonl:1: 'prompt' holds a lone surrogate"):
        read_prompts(chat, "prompt", "label")


def hostile_sample(index: int) -> SimpleNamespace:
    """A sample as a generate hook may return it: its response holding a lone surrogate."""
    return SimpleNamespace(index=index, group_index=0, prompt="1+1=", response=LONE, label="2", reward=0.0,
                           raw_reward=0.0, response_length=3, status="completed", metadata={}, weight_version="0",
                           num_turns=1, rollout_log_probs=[-0.5])


def test_the_samples_file_holds_valid_text(tmp_path):
    path = write_samples(tmp_path, 0, [hostile_sample(0)])
    row = json.loads(path.read_text().splitlines()[0])
    assert row["response"] == "lone \ufffd surrogate"
    row["response"].encode("utf-8")


def raw_samples(run_dir: Path, rollout_id: int) -> Path:
    """A samples file written before this fix (or by hand): the surrogate spelled `\\ud800` in its JSON."""
    path = samples_path(run_dir, rollout_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rollout_id": rollout_id, "index": 0, "prompt": "1+1=", "response": LONE,
                                "label": "2\udfff", "reward": 0.0}) + "\n")
    return path


def mlflow_sink(tmp_path: Path) -> MlflowSink:
    sink = MlflowSink({}, f"sqlite:///{tmp_path / 'mlflow.db'}", "e", run_name="r",
                      artifact_dir=str(tmp_path / "artifacts"))
    sink.open()
    return sink


def test_a_sample_with_a_lone_surrogate_reaches_mlflow_with_its_metrics(tmp_path):
    from mlflow.tracking import MlflowClient

    sink = mlflow_sink(tmp_path)
    try:
        sink.deliver(Delivery([JournalLine(0, 100.0, {"rollout/raw_reward": 0.5})], {0: raw_samples(tmp_path, 0)}))
        sink.deliver(Delivery([JournalLine(1, 101.0, {"rollout/raw_reward": 0.7})], first=1))
    finally:
        sink.close()
    client = MlflowClient(tracking_uri=sink.tracking_uri)
    assert [m.value for m in client.get_metric_history(sink.run_id, "rollout/raw_reward")] == [0.5, 0.7]
    table = json.loads(Path(client.download_artifacts(sink.run_id, "samples/rollout_000000.table.json",
                                                      str(tmp_path / "down"))).read_text())
    cells = dict(zip(table["columns"], table["data"][0]))
    assert cells["response"] == "lone \ufffd surrogate" and cells["label"] == "2\ufffd"


def test_a_failing_sample_table_never_holds_the_metrics_back(tmp_path, monkeypatch, caplog):
    """Whatever text a table may still fail on (here: the surrogate let through, as before the fix, so
    MLflow's own writer refuses it): the line's metrics and every later line's are delivered, and the
    delivery log names the table that is missing."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setattr("miles.record.sample_table.valid_text", lambda value: value)
    sink = mlflow_sink(tmp_path)
    try:
        with caplog.at_level(logging.WARNING, logger="miles.tracking"):
            sink.deliver(Delivery([JournalLine(0, 100.0, {"rollout/raw_reward": 0.5})],
                                  {0: raw_samples(tmp_path, 0)}))
        sink.deliver(Delivery([JournalLine(1, 101.0, {"rollout/raw_reward": 0.7})], first=1))
    finally:
        sink.close()
    history = MlflowClient(tracking_uri=sink.tracking_uri).get_metric_history(sink.run_id, "rollout/raw_reward")
    assert [m.value for m in history] == [0.5, 0.7]
    assert "no sample table for rollout_000000.jsonl (MlflowException" in caplog.text
    assert "surrogates not allowed" in caplog.text


def test_an_outage_while_logging_the_table_is_retried_with_the_lines(tmp_path, monkeypatch):
    """Only a table's own data is skipped: a server that fails meanwhile fails the delivery (the loop
    retries it, the lines stay spooled until then)."""
    from mlflow.exceptions import MlflowException

    sink = mlflow_sink(tmp_path)

    def outage(*args, **kwargs):
        raise MlflowException("API request to endpoint /api/2.0/mlflow/runs/log-artifact failed with error "
                              "code 503 != 200")

    monkeypatch.setattr(sink.client, "log_table", outage)
    try:
        with pytest.raises(MlflowException, match="503"):
            sink.deliver(Delivery([JournalLine(0, 100.0, {"rollout/raw_reward": 0.5})],
                                  {0: raw_samples(tmp_path, 0)}))
    finally:
        sink.close()


def test_the_dashboard_serves_a_rollout_with_a_lone_surrogate(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RECORDED, run)
    path = run / "samples" / "rollout_000000.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[0] = {**rows[0], "response": LONE, "label": "\udc80", "messages": [{"role": "user", "content": LONE}]}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    client = TestClient(build_app(run), raise_server_exceptions=False)
    table = client.get("/api/rollouts/0")
    assert table.status_code == 200, table.text[:300]
    assert len(table.json()["samples"]) == len(rows)
    index = rows[0]["index"]
    sample = client.get(f"/api/rollouts/0/samples/{index}")
    assert sample.status_code == 200 and sample.json()["sample"]["response"] == "lone \ufffd surrogate"


def test_a_samples_file_past_the_bound_is_not_uploaded_whole(tmp_path, monkeypatch, caplog):
    """ST3: the whole samples file went to MLflow (45 MB for a rollout of 1 MiB responses) while its table
    is bounded. Past MAX_SAMPLES_UPLOAD the file stays in the run dir; the table and metrics go up."""
    from mlflow.tracking import MlflowClient

    from miles.tracking.sinks import mlflow_sink as module

    path = raw_samples(tmp_path, 0)
    monkeypatch.setattr(module, "MAX_SAMPLES_UPLOAD", path.stat().st_size - 1)
    sink = mlflow_sink(tmp_path)
    try:
        with caplog.at_level(logging.WARNING, logger="miles.tracking"):
            sink.deliver(Delivery([JournalLine(0, 100.0, {"rollout/raw_reward": 0.5})], {0: path}))
    finally:
        sink.close()
    client = MlflowClient(tracking_uri=sink.tracking_uri)
    uploaded = {f.path for f in client.list_artifacts(sink.run_id, "samples")}
    assert uploaded == {"samples/rollout_000000.table.json"}
    assert "rollout_000000.jsonl is 0.0 MiB" in caplog.text and "not uploaded" in caplog.text
    assert [m.value for m in client.get_metric_history(sink.run_id, "rollout/raw_reward")] == [0.5]
