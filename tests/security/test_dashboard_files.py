"""Probes A5/A6: the dashboard on odd-typed but parseable run files, and its server's header limits.

A line of the wrong shape is skipped and counted like one that does not parse (never a 500); one
sample with a null prompt does not empty the Rollouts view; the server answers 431 to oversized
heads and closes a connection whose head does not arrive, as the engine and the router do.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from miles.dashboard.app import build_app

from tests.support.dashboard import RECORDED, serve_dashboard
from .probes import port_of, raw_request

ENDPOINTS = ["/api/run", "/api/metrics", "/api/watch", "/api/timeline", "/api/timeline?rollout_id=0",
             "/api/timeline/chrome", "/api/health", "/api/profiler", "/api/rollouts", "/api/rollouts/0",
             "/api/rollouts/0?min_reward=0.5&max_length=10&min_turns=1&zero_std=true", "/api/rollouts/0/samples/0",
             "/api/rollouts/2", "/api/rollouts/2/samples/1"]


def sample_line(**fields) -> str:
    path = RECORDED / "samples" / "rollout_000000.jsonl"
    row = json.loads(path.read_text().splitlines()[0])
    return json.dumps({**row, **fields})


def append(relative: str, text: str):
    def change(run: Path):
        with (run / relative).open("a") as f:
            f.write(text + "\n")
    return change


def replace(relative: str, text: str):
    def change(run: Path):
        (run / relative).write_text(text + "\n")
    return change


def make_dir(relative: str):
    def change(run: Path):
        path = run / relative
        if path.exists():
            path.unlink()
        path.mkdir(parents=True)
    return change


SAMPLES0 = "samples/rollout_000000.jsonl"
CASES = {
    "journal rollout_id null": append("metrics.jsonl", '{"rollout_id": null, "time": 1.0}'),
    "journal rollout_id a string": append("metrics.jsonl", '{"rollout_id": "x", "time": 1.0}'),
    "journal rollout_id a list": append("metrics.jsonl", '{"rollout_id": [1], "time": 1.0}'),
    "journal rollout_id a float": append("metrics.jsonl", '{"rollout_id": 1.5, "time": 1.0}'),
    "journal string metric": append("metrics.jsonl", '{"rollout_id": 9, "time": 1.0, "train/loss": "high"}'),
    "journal NaN": append("metrics.jsonl", '{"rollout_id": 9, "time": 1.0, "train/loss": NaN}'),
    "journal a directory": make_dir("metrics.jsonl"),
    "span without start": append("timeline.jsonl", '{"lane": "x", "name": "y", "end": 1.0}'),
    "span start a string": append("timeline.jsonl", '{"lane": "x", "name": "y", "start": "abc", "end": 1.0}'),
    "span start NaN": append("timeline.jsonl", '{"lane": "x", "name": "y", "start": NaN, "end": 1.0}'),
    "span rollout_id a list": append("timeline.jsonl", '{"lane": "x", "start": 1.0, "end": 2.0, "rollout_id": [0]}'),
    "timeline a directory": make_dir("timeline.jsonl"),
    "health rollout_id a list": replace("health.jsonl", '{"rollout_id": [1], "signal": "loss", "severity": "red"}'),
    "health signal a list": replace("health.jsonl", '{"rollout_id": 1, "signal": ["loss"], "severity": "red"}'),
    "health a directory": make_dir("health.jsonl"),
    "sample group_index a list": append(SAMPLES0, sample_line(group_index=[1])),
    "sample reward a list": append(SAMPLES0, sample_line(reward=[1])),
    "sample reward a string": append(SAMPLES0, sample_line(reward="high")),
    "sample response_length a string": append(SAMPLES0, sample_line(response_length="long")),
    "sample index a string": append(SAMPLES0, sample_line(index="a")),
    "sample messages an int": append(SAMPLES0, sample_line(messages=5, num_turns=None)),
    "samples a directory": make_dir(SAMPLES0),
    "config a list": replace("tracking/config.yaml", "- a\n- b"),
    "config clip_grad a list": replace("tracking/config.yaml", "clip_grad: [1]"),
    "config deep": replace("tracking/config.yaml", "a: " + "[" * 5000 + "]" * 5000),
    "base_eval a list": replace("base_eval.json", "[1, 2]"),
    "profiler a list line": replace("profiler/summaries.jsonl", "[1, 2]"),
}


@pytest.fixture
def run(tmp_path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(RECORDED, target)
    (target / "profiler").mkdir(exist_ok=True)
    return target


@pytest.mark.parametrize("change", CASES.values(), ids=CASES.keys())
def test_odd_run_files_never_answer_500(run, change):
    change(run)
    client = TestClient(build_app(run), raise_server_exceptions=False)
    for path in ENDPOINTS:
        answer = client.get(path)
        assert answer.status_code < 500, f"{path}: {answer.status_code} {answer.text[:300]}"


def test_odd_lines_are_counted_as_skipped(run):
    append("metrics.jsonl", '{"rollout_id": "x", "time": 1.0}')(run)
    summary = TestClient(build_app(run)).get("/api/run").json()
    assert summary["files"]["journal"]["skipped"] == 1 and summary["iterations"] == 4
    assert any("journal: 1 unreadable" in c for c in summary["corrupt"])


def test_a_null_prompt_keeps_every_sample_in_the_rollouts_view(run):
    append(SAMPLES0, sample_line(prompt=None, response=None, index=99))(run)
    client = TestClient(build_app(run))
    table = client.get("/api/rollouts/0").json()
    assert table["total"] == 17 and len(table["samples"]) == 17
    assert all(isinstance(s["prompt"], str) and isinstance(s["response"], str) for s in table["samples"])
    assert client.get("/api/rollouts/0/samples/99").json()["sample"]["prompt"] == ""


def test_dashboard_server_limits_request_heads(tmp_path):
    served = serve_dashboard(tmp_path)
    try:
        port = port_of(served.url)
        assert httpx.get(served.url + "/api/run", headers={"x-big": "a" * 200_000}, timeout=30).status_code == 431
        many = b"GET /api/run HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"x-h: 1\r\n" * 20_000 + b"\r\n"
        assert raw_request(port, many).startswith(b"HTTP/1.1 431")
        # a head that never completes: answered 408 and closed (the read ends when the server closes)
        assert raw_request(port, b"GET /api/run HTTP/1.1\r\nHost: 127.0.0.1\r\n", timeout=60).startswith(b"HTTP/1.1 408")
        ok = raw_request(port, b"GET /api/run HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200")
    finally:
        served.stop()
