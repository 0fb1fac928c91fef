"""Every dashboard endpoint on a recorded run, plus missing, torn and extra files (health, profiler,
multi-turn), the read-only guarantee and the token off loopback."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import httpx
import pytest
from fastapi.testclient import TestClient

from miles.config import ConfigError
from miles.dashboard.app import build_app, check_bind
from miles.health.report import panels

from tests.support.dashboard import RECORDED, serve


@pytest.fixture
def client(run_copy):
    return TestClient(build_app(run_copy))


def get(client, path: str) -> dict:
    response = client.get(path)
    assert response.status_code == 200, response.text
    return response.json()


def test_run_summary_names_what_is_missing(client):
    run = get(client, "/api/run")
    assert run["iterations"] == 4 and run["last_rollout_id"] == 3 and run["num_rollout"] == 4
    # four iterations and the eval before training (its own line)
    assert run["files"]["journal"] == {"path": "metrics.jsonl", "present": True, "lines": 5, "skipped": 0}
    assert run["files"]["samples"]["rollouts"] == 2 and run["files"]["tokens"]["rollouts"] == 2
    # the recorded run's watch flagged nothing (no health.jsonl, by design) and it profiled nothing: neither
    # is "missing"; the watch's ten health/<signal> figures in the journal say it ran
    assert run["missing"] == []
    assert run["off"] == ["profiling off (no profiler window in this run)"]
    assert run["health"]["state"] == "healthy" and run["health"]["rollouts"] == 4
    assert len(run["health"]["signals"]) == 10 and "grad_norm" in run["health"]["signals"]


def test_a_run_without_a_health_watch_says_health_is_not_available(run_copy, client):
    lines = [json.loads(t) for t in (run_copy / "metrics.jsonl").read_text().splitlines()]
    (run_copy / "metrics.jsonl").write_text("".join(
        json.dumps({k: v for k, v in line.items() if not k.startswith("health/")}) + "\n" for line in lines))
    run = get(client, "/api/run")
    assert run["missing"] == ["health (health.jsonl)"] and run["health"]["state"] == "not available"
    assert get(client, "/api/watch")["health"] == "not available"


def test_the_eval_before_training_is_plotted_at_step_0_not_counted(client):
    first = json.loads((RECORDED / "metrics.jsonl").read_text().splitlines()[0])
    assert first["rollout_id"] == -1 and first["eval/step"] == 0  # the recorded run's base eval line
    assert get(client, "/api/run")["iterations"] == 4
    assert get(client, "/api/metrics")["series"]["eval/arithmetic"]["x"] == [0.0, 1.0, 3.0]


def test_metrics_every_key_on_its_own_step_axis(client):
    data = get(client, "/api/metrics")
    assert {"train", "rollout", "perf", "eval"} <= set(data["namespaces"])
    journal = [json.loads(line) for line in (RECORDED / "metrics.jsonl").read_text().splitlines()]
    assert data["series"]["train/loss"]["step_key"] == "train/step"
    iterations = [row for row in journal if row["rollout_id"] >= 0]
    assert data["series"]["train/loss"]["y"] == [row["train/loss"] for row in iterations]
    assert data["series"]["perf/rollout_time"]["x"] == [row["rollout/step"] for row in iterations]
    evals = [row for row in journal if "eval/arithmetic" in row]
    assert data["series"]["eval/arithmetic"]["x"] == [row["eval/step"] for row in evals] == [0.0, 1.0, 3.0]
    assert "rollout/step" not in data["series"]  # step counters are axes, not metrics


def test_watch_has_the_eight_panels_in_the_pages_order(client):
    data = get(client, "/api/watch")
    assert [p["title"] for p in data["panels"]] == [p.title for p in panels(1.0)]
    by_title = {p["title"]: p for p in data["panels"]}
    assert by_title["grad_norm"]["threshold"] == 1.0  # clip_grad from the run's config
    assert by_title["pg_clipfrac"]["threshold"] == 0.2
    assert by_title["kl_loss (--use-kl-loss)"]["series"] == {}  # not logged without --use-kl-loss
    assert set(by_title["rollout_time vs train_time (s)"]["series"]) == {"perf/rollout_time", "perf/train_time"}
    assert data["health"] == "healthy" and data["health_rollouts"] == 4 and len(data["health_signals"]) == 10


def test_health_verdicts_mark_their_panel(run_copy, client):
    verdicts = [{"rollout_id": 2, "signal": "grad_norm", "severity": "warning", "message": "hit clip_grad 3 times",
                 "values": {"grad_norm": 1.0}},
                {"rollout_id": 3, "signal": "raw_reward", "severity": "red", "message": "collapsed",
                 "values": {}},
                {"rollout_id": 3, "signal": "rollout_train_time", "severity": "warning", "message": "imbalance",
                 "values": {}},
                {"rollout_id": 1, "signal": "stall", "severity": "red", "message": "slow", "values": {}}]
    (run_copy / "health.jsonl").write_text("".join(json.dumps(v) + "\n" for v in verdicts))
    data = get(client, "/api/watch")
    by_title = {p["title"]: p for p in data["panels"]}
    assert data["health"] == "available"
    assert by_title["grad_norm"]["verdicts"] == [verdicts[0]]
    assert by_title["raw_reward"]["verdicts"] == [verdicts[1]]
    assert by_title["loss"]["verdicts"] == []
    assert by_title["rollout_time vs train_time (s)"]["verdicts"] == [verdicts[2]]
    assert data["other_verdicts"] == [verdicts[3]]  # a signal without a panel is listed apart
    # marked on the panel's own step axis: train/step of rollout 2 (one optimizer step per rollout here)
    assert by_title["grad_norm"]["flag_steps"] == [2.0] and by_title["raw_reward"]["flag_steps"] == [3.0]
    assert get(client, "/api/health")["verdicts"] == verdicts
    # the run keeps its health line (N32): each signal's flags per severity, for the banner
    health = get(client, "/api/run")["health"]
    assert health["red"] == {"raw_reward": 1, "stall": 1}
    assert health["warning"] == {"grad_norm": 1, "rollout_train_time": 1}


def test_timeline_lanes_and_phases(client):
    data = get(client, "/api/timeline")
    assert data["lanes"][:3] == ["trainer", "rank0", "rank1"] and data["lanes"][3].startswith("engine ")
    assert data["lanes"][4:] == ["router"]
    names = {(s["lane"], s["name"]) for s in data["spans"]}
    assert {("trainer", "rollout"), ("trainer", "train"), ("trainer", "update_weights"), ("trainer", "eval"),
            ("trainer", "checkpoint"), ("rank0", "log_probs"), ("rank1", "actor_train")} <= names
    # busy shares of the iterations' wall time: the trainer drives every phase, ranks and engine take turns
    use = data["utilization"]
    assert use["trainer"] > 0.8 and all(0 < use[lane] < use["trainer"] for lane in data["lanes"][1:])
    one = get(client, "/api/timeline?rollout_id=1")
    assert {s["rollout_id"] for s in one["spans"] if s["lane"] == "trainer"} == {1}
    assert {s["name"] for s in one["spans"] if s["lane"] == "trainer"} == {"rollout", "train", "update_weights",
                                                                          "eval"}  # eval every 2 rollouts


def test_engine_batches_join_the_rollout_they_ran_in(client):
    everything = get(client, "/api/timeline")
    engine = everything["lanes"][3]
    assert engine.startswith("engine 127.0.0.1:")
    batches = [s for s in everything["spans"] if s["lane"] == engine]
    assert batches and all(s["name"] == "decode" and s["args"]["requests"] >= 1 for s in batches)
    shown = 0
    for rollout_id in range(4):
        one = get(client, f"/api/timeline?rollout_id={rollout_id}")
        own = [s for s in one["spans"] if s["rollout_id"] == rollout_id]
        start, end = min(s["start"] for s in own), max(s["end"] for s in own)
        inside = [s for s in one["spans"] if s["lane"] == engine]
        assert inside and all(s["start"] < end and s["end"] > start for s in inside)
        shown += len(inside)
    assert shown < len(batches)  # the base eval's batches ran before rollout 0


def test_router_lane_has_a_burst_of_requests_in_each_rollout_and_its_events(client):
    everything = get(client, "/api/timeline")
    router = [s for s in everything["spans"] if s["lane"] == "router"]
    # the run registered its engine, then told the router each weight version (0 at the start, then 1..4)
    engine_url = "http://" + everything["lanes"][3].removeprefix("engine ")
    assert [s["args"]["url"] for s in router if s["name"] == "add_worker"] == [engine_url]
    assert [s["args"]["weight_version"] for s in router if s["name"] == "update_weight_version"] == \
        ["0", "1", "2", "3", "4"]
    assert 0 < everything["utilization"]["router"] < everything["utilization"]["trainer"]
    for rollout_id in range(4):
        one = get(client, f"/api/timeline?rollout_id={rollout_id}")
        (rollout,) = [s for s in one["spans"] if (s["lane"], s["name"]) == ("trainer", "rollout")]
        bursts = [s for s in one["spans"] if s["lane"] == "router" and s["name"] == "proxy"]
        # the rollout's 16 samples went through the router in one burst (rollout 2's joined eval 1's 32,
        # which ran right before it)
        assert any(s["start"] < rollout["end"] and s["end"] > rollout["start"] and s["args"]["requests"] >= 16
                   and s["args"]["errors"] == 0 for s in bursts)


def test_chrome_trace_has_one_event_per_span(client):
    spans = get(client, "/api/timeline")["spans"]
    response = client.get("/api/timeline/chrome")
    assert "attachment" in response.headers["content-disposition"]
    events = response.json()["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(spans)
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert threads == set(get(client, "/api/timeline")["lanes"]) and "router" in threads
    assert {e["name"] for e in complete if e["tid"] == max(e["tid"] for e in complete)} == {
        "add_worker", "update_weight_version", "proxy"}  # the router's lane comes last
    first = min(spans, key=lambda s: s["start"])
    assert any(e["ts"] == 0 and e["name"] == first["name"] for e in complete)


def test_rollouts_list_with_group_degeneracy(client):
    rollouts = get(client, "/api/rollouts")["rollouts"]
    assert [r["rollout_id"] for r in rollouts] == [0, 2]  # --log-samples-interval 2
    for r in rollouts:
        rows = [json.loads(line) for line in (RECORDED / "samples" / f"rollout_{r['rollout_id']:06d}.jsonl")
                .read_text().splitlines()]
        groups = {}
        for row in rows:
            groups.setdefault(row["group_index"], set()).add(row["reward"])
        assert r["zero_std_groups"] == sum(len(v) == 1 for v in groups.values())
        assert r["samples"] == len(rows) and r["has_tokens"]


@pytest.mark.parametrize("query, keep", [
    ("min_reward=1", lambda s: s["reward"] >= 1),
    ("max_reward=0", lambda s: s["reward"] <= 0),
    ("min_length=4&max_length=6", lambda s: 4 <= s["response_length"] <= 6),
    ("truncated=true", lambda s: s["status"] == "truncated"),
    ("truncated=false", lambda s: s["status"] != "truncated"),
    ("zero_std=true", lambda s: s["zero_std"]),
])
def test_rollout_filters(client, query, keep):
    everything = get(client, "/api/rollouts/2")["samples"]
    filtered = get(client, f"/api/rollouts/2?{query}")["samples"]
    assert [s["index"] for s in filtered] == [s["index"] for s in everything if keep(s)]


def test_rollout_errors(client):
    assert client.get("/api/rollouts/1").status_code == 404  # not a logged rollout
    assert client.get("/api/rollouts/0/samples/99").status_code == 404
    assert client.get("/api/rollouts/0?min_length=-1").status_code == 422


def test_sample_tokens_line_up_with_the_response(client):
    detail = get(client, "/api/rollouts/0/samples/2")
    sample, tokens = detail["sample"], detail["tokens"]
    n = sample["response_length"]
    for key in ("ids", "text", "rollout_log_probs", "log_probs", "entropy", "loss_mask"):
        assert len(tokens[key]) == n, key
    assert "".join(tokens["text"]).startswith(sample["response"])
    # the ranks score the same weights that sampled: train and rollout log-probs agree closely
    assert max(abs(a - b) for a, b in zip(tokens["log_probs"], tokens["rollout_log_probs"])) < 1e-3
    assert all(e > 0 for e in tokens["entropy"])


def test_sample_without_token_file_says_so(run_copy, client):
    (run_copy / "tokens" / "rollout_000000.jsonl").unlink()
    detail = get(client, "/api/rollouts/0/samples/1")
    assert detail["tokens"] is None and "not available" in detail["tokens_note"]


def test_multi_turn_samples(run_copy, client):
    messages = [{"role": "user", "content": "2+2=?"},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calc",
                                                                                  "arguments": "{\"x\": \"2+2\"}"}}]},
                {"role": "tool", "content": "4"}, {"role": "assistant", "content": "4"}]
    row = {"rollout_id": 4, "index": 0, "group_index": 0, "prompt": "2+2=?", "response": "calc 4 4",
           "reward": 1.0, "response_length": 5, "status": "completed", "messages": messages}
    (run_copy / "samples" / "rollout_000004.jsonl").write_text(json.dumps(row) + "\n")
    tokens = {"index": 0, "group_index": 0, "ids": [1, 2, 3, 4, 5], "text": ["c", "a", "4", "4", "."],
              "rollout_log_probs": [-1] * 5, "log_probs": [-1] * 5, "entropy": [1] * 5, "loss_mask": [1, 1, 0, 1, 1]}
    (run_copy / "tokens" / "rollout_000004.jsonl").write_text(json.dumps(tokens) + "\n")
    assert get(client, "/api/rollouts/4?min_turns=2")["samples"][0]["turns"] == 2
    assert get(client, "/api/rollouts/4?max_turns=1")["samples"] == []
    detail = get(client, "/api/rollouts/4/samples/0")
    assert detail["messages"] == messages and detail["tokens"]["loss_mask"] == [1, 1, 0, 1, 1]


def test_profiler_summaries(run_copy, client):
    summary = {"target": "train_actor", "rank": 0, "start": 1, "end": 2, "trace": "profiler/rank0.json",
               "top_ops": [{"name": "aten::mm", "self_cpu_ms": 3.0}], "spans": []}
    (run_copy / "profiler").mkdir()
    (run_copy / "profiler" / "summaries.jsonl").write_text(json.dumps(summary) + "\n")
    assert get(client, "/api/profiler") == {"available": True, "summaries": [summary]}
    assert get(client, "/api/timeline")["profiler"]["summaries"] == [summary]


def test_torn_and_corrupt_lines_are_left_out(run_copy, client):
    with (run_copy / "metrics.jsonl").open("a") as f:
        f.write("not json\n")
        f.write('{"rollout_id": 4, "time": 1.0, "train/loss"')  # a line still being written
    with (run_copy / "timeline.jsonl").open("a") as f:
        f.write('{"lane": "trainer", "name": "rollout", "start": 1')
    run = get(client, "/api/run")
    assert run["iterations"] == 4 and run["files"]["journal"]["skipped"] == 1
    assert run["corrupt"] == ["journal: 1 unreadable lines"]
    assert len(get(client, "/api/metrics")["series"]["train/loss"]["y"]) == 4
    spans = get(client, "/api/timeline")["spans"]
    assert len(spans) == len((RECORDED / "timeline.jsonl").read_text().splitlines())  # the torn line is not one


def test_empty_run_dir_shows_what_is_missing(tmp_path):
    client = TestClient(build_app(tmp_path))
    run = get(client, "/api/run")
    # every source is missing, but a run that did not profile is "profiling off", not a missing file
    assert run["iterations"] == 0 and len(run["missing"]) == len(run["files"]) - 1 and run["off"]
    assert get(client, "/api/metrics")["series"] == {}
    assert all(p["series"] == {} for p in get(client, "/api/watch")["panels"])
    assert get(client, "/api/timeline")["available"] is False
    assert get(client, "/api/rollouts")["rollouts"] == []
    assert client.get("/").status_code == 200


def _snapshot(root) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_reading_never_writes(run_copy, client):
    before = _snapshot(run_copy)
    entries = sorted(os.listdir(run_copy))
    for path in ["/", "/api/run", "/api/metrics", "/api/watch", "/api/timeline", "/api/timeline/chrome",
                 "/api/health", "/api/profiler", "/api/rollouts", "/api/rollouts/0", "/api/rollouts/2/samples/3"]:
        assert client.get(path).status_code == 200, path
    assert _snapshot(run_copy) == before and sorted(os.listdir(run_copy)) == entries


def test_token_required_off_loopback(run_copy):
    with pytest.raises(ConfigError, match="--dashboard-token"):
        check_bind("0.0.0.0", None)
    check_bind("127.0.0.1", None)
    client = TestClient(build_app(run_copy, token="s3cret"))
    assert client.get("/api/run").status_code == 401
    assert client.get("/api/run", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/api/run", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/api/run?token=s3cret").status_code == 200
    assert client.get("/").status_code == 200  # the page itself holds no run data


def test_command_serves_on_loopback_and_checks_its_flags(run_copy, tmp_path):
    served = serve(run_copy)
    try:
        assert served.url.startswith("http://127.0.0.1:")
        assert httpx.get(served.url + "/api/run").json()["iterations"] == 4
    finally:
        served.stop()
    cases = [([str(tmp_path / "nope")], "RUN_DIR"), ([str(run_copy), "--host", "0.0.0.0"], "--dashboard-token"),
             ([str(run_copy), "--port", "70000"], "--port")]
    env = {k: v for k, v in os.environ.items() if k != "MILES_DASHBOARD_TOKEN"}
    for argv, named in cases:
        done = subprocess.run([sys.executable, "-m", "flows.cli", "dashboard", *argv], capture_output=True,
                              text=True, env=env, timeout=60)
        assert done.returncode == 2 and named in done.stderr, (argv, done.stderr)
