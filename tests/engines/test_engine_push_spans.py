"""Issue 54, the engine side: two live embedded engines on loopback write their own phases of a
weight push (receive, apply, pause, continue, and their waits) on their timeline lanes with their
coordinates, by disk and by broadcast; WeightSync turns them into the spread of the engines' own
receive+apply seconds; an engine slowed in its apply (the slow-engine-apply fault's engine flag)
is the one named, by the metrics, the straggler signal and `miles diagnose`."""
from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from miles.backends.sync import WeightSync
from miles.backends.weight_broadcast import WeightBroadcaster
from miles.config import EngineConfig
from miles.config.health import HealthConfig
from miles.diagnose.slowest_rank import slowest_engine_lines
from miles.engines.launch import launch_engine
from miles.health.detectors import Rollout
from miles.health.straggler import check_straggler
from miles.record import layout
from miles.record.journal import JournalLine
from miles.record.timeline import read_spans
from miles.run.engine_stragglers import KEY, SpanTail, engine_own_seconds, engine_time_metrics

TOKEN = "push-spans-test-token"
SLOW_S, SLOW_FROM = 0.6, 3  # engine 1 applies 0.6 s late from weight version 3 on


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("push-spans") / "run"


@pytest.fixture(scope="module")
def engines(base_model, run_dir):
    timeline = str(run_dir / layout.TIMELINE)
    handles = []
    try:
        for index in range(2):
            slow = ["--inject-slow-apply", f"{SLOW_S}@{SLOW_FROM}"] if index == 1 else []
            handles.append(launch_engine(
                base_model, EngineConfig(engine_device="cpu", engine_max_batch_size=4),
                log_path=run_dir.parent / f"engine-{index}.log",
                env={"MILES_ENGINE_ADMIN_TOKEN": TOKEN},
                serve_args=["--timeline-path", timeline, "--engine-index", str(index), *slow]))
        yield handles
    finally:
        for handle in handles:
            handle.stop()


class Ranks:
    """The ranks' side of a disk push: rank 0's export is the base checkpoint, copied."""

    def __init__(self, base_model: Path, run_dir: Path):
        self.base_model = base_model
        self.config = SimpleNamespace(train=SimpleNamespace(run_dir=str(run_dir)))

    def call_bounded(self, method, directory, version, grace_s, gone, hung):
        shutil.copytree(self.base_model, directory)
        return [None], [0.01]

    def call(self, method, version):
        pass


def push_spans(spans, version=None):
    """The engines' push spans (not their decoding), of one version where given."""
    out = [s for s in spans if s.lane.startswith("engine") and "kind" in s.args]
    return [s for s in out if version is None or s.args.get("weight_version") == str(version)]


def test_a_disk_push_writes_each_engines_phases_with_its_coordinates(engines, base_model, run_dir):
    urls = [e.url for e in engines]
    sync = WeightSync(Ranks(base_model, run_dir), urls, None, run_dir / "weights", in_memory=False,
                      admin_token=TOKEN)
    sync.push(1, pause_mode="in_place")
    spans = push_spans(read_spans(run_dir / layout.TIMELINE))
    for index, url in enumerate(urls):
        mine = [s for s in spans if s.args.get("engine") == index]
        assert {s.args["url"] for s in mine} == {url}
        assert {s.args["coords"] for s in mine} == {f"engine{index} {url}"}
        assert {s.lane for s in mine} == {f"engine {url.removeprefix('http://')}"}
        named = {(s.name, s.args["kind"], s.args.get("phase")) for s in mine}
        assert {("receive", "compute", None), ("apply", "compute", None), ("wait", "wait", "apply"),
                ("pause", "compute", None), ("continue", "compute", None)} <= named
        (receive,) = [s for s in mine if s.name == "receive"]
        (apply,) = [s for s in mine if s.name == "apply"]
        assert receive.args["source"] == "disk" and receive.args["weight_version"] == "1"
        assert receive.end <= apply.start  # read and checked, then swapped in
        (cont,) = [s for s in mine if s.name == "continue"]
        (pause,) = [s for s in mine if s.name == "pause"]
        assert pause.args["mode"] == "in_place"
        assert cont.args["paused_s"] == pytest.approx(cont.start - pause.end, abs=1e-5)
    own = engine_own_seconds(spans, urls)
    assert set(own) == {0, 1}
    times = sync.last_times  # the journal's keys of this push
    assert times[KEY + "min"] == min(own.values()) and times[KEY + "max"] == max(own.values())
    assert times[KEY + "min"] <= times[KEY + "p50"] <= times[KEY + "max"]
    assert times[KEY + "slowest"] in (0.0, 1.0)
    assert "perf/update_weights_engine_0_time" in times  # the sender's clock, still logged


@pytest.fixture(scope="module")
def sent(base_model):
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    tied = bool(model.config.tie_word_embeddings)
    return [(k, v + 0.01) for k, v in model.state_dict().items()
            if not (tied and k == "lm_head.weight")]


def test_a_broadcast_push_writes_each_bucket_and_the_waits_between(engines, sent, run_dir):
    urls = [e.url for e in engines]
    tail = SpanTail(run_dir / layout.TIMELINE)
    sender = WeightBroadcaster(urls, TOKEN, timeout_s=60.0)
    try:
        stats = sender.push(sent, 400_000, "2")
    finally:
        sender.close()
    buckets = len(stats.bucket_seconds)
    assert buckets >= 3
    spans = push_spans(tail.spans())
    for index, url in enumerate(urls):
        mine = [s for s in spans if s.args.get("engine") == index]
        receives = [s for s in mine if s.name == "receive"]
        assert len(receives) == buckets and {s.args["source"] for s in receives} == {"broadcast"}
        assert all(s.args["coords"] == f"engine{index} {url}" for s in mine)
        assert receives[-1].args["weight_version"] == "2"  # only the last bucket carries it
        gaps = [s for s in mine if s.name == "wait" and s.args["phase"] == "receive"]
        assert len(gaps) == buckets - 1  # waiting on the sender between two buckets
        assert all(a.end <= g.start + 1e-6 and g.end <= b.start + 1e-6
                   for a, g, b in zip(receives, gaps, receives[1:]))
        assert [s.args["weight_version"] for s in mine if s.name == "apply"] == ["2"]
    metrics = engine_time_metrics(engine_own_seconds(spans, urls))
    assert set(metrics) == {KEY + k for k in ("min", "p50", "max", "slowest")}


def test_two_stage_groups_at_once_count_once_per_engine(engines, sent, run_dir):
    """Two pipeline stages send their halves over their own groups at the same time: each engine's
    receive spans name their group, it applies once, and its own time is what its spans cover
    (the stages' buckets overlap), within the push's wall time."""
    urls = [e.url for e in engines]
    tail = SpanTail(run_dir / layout.TIMELINE)
    half = len(sent) // 2
    stages = [WeightBroadcaster(urls, TOKEN, group_name=f"miles-pp_{s}", timeout_s=60.0,
                                push_groups=2) for s in (0, 1)]
    parts = [sent[:half], sent[half:]]
    threads = [threading.Thread(target=stage.push, args=(part, 300_000, "2b"))
               for stage, part in zip(stages, parts)]
    began = time.time()
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for stage in stages:
            stage.close()
    wall = time.time() - began
    spans = push_spans(tail.spans())
    own = engine_own_seconds(spans, urls)
    for index in range(2):
        mine = [s for s in spans if s.args.get("engine") == index]
        groups = {s.args["group"] for s in mine if s.name == "receive"}
        assert groups == {"miles-pp_0", "miles-pp_1"}
        assert [s.args["weight_version"] for s in mine if s.name == "apply"] == ["2b"]
        summed = sum(s.end - s.start for s in mine if s.name in ("receive", "apply"))
        assert own[index] <= summed + 1e-9 and own[index] <= wall


def test_a_slow_engine_is_named_by_the_metrics_the_signal_and_diagnose(engines, base_model,
                                                                       run_dir):
    urls = [e.url for e in engines]
    sync = WeightSync(Ranks(base_model, run_dir), urls, None, run_dir / "weights", in_memory=False,
                      admin_token=TOKEN)
    cfg = HealthConfig()
    rows = []
    for version in range(SLOW_FROM, SLOW_FROM + cfg.health_straggler_window):
        sync.push(version)
        times = dict(sync.last_times)
        assert times[KEY + "slowest"] == 1.0, times
        assert times[KEY + "max"] - times[KEY + "min"] >= SLOW_S * 0.9
        rows.append(times)
    apply = [s for s in push_spans(read_spans(run_dir / layout.TIMELINE), SLOW_FROM)
             if s.name == "apply" and s.args.get("engine") == 1]
    assert apply and apply[0].end - apply[0].start >= SLOW_S  # inside its own apply span
    history = [Rollout(i, m) for i, m in enumerate(rows)]
    verdict = check_straggler(history, cfg, None)
    assert verdict is not None and verdict.message.startswith("engine 1 is the straggler")
    assert check_straggler(history[:-1], cfg, None) is None  # not before its window
    lines = [JournalLine(i, 1.0 + i, m) for i, m in enumerate(rows)]
    (line,) = slowest_engine_lines(lines, cfg)
    assert line.startswith("slowest engine: engine 1 in the weight push") and "3 of 3" in line
