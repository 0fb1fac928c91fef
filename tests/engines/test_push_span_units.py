"""The engine's push spans without an engine: the slow-engine-apply fault's spec and the engine
flags a run's launcher derives from it, the recorder's waits between broadcast buckets, and the
per-push engine metrics (no slowest engine with one engine)."""
from __future__ import annotations

import pytest

from miles.cluster.local import engine_args
from miles.config import ConfigError, parse_config
from miles.engines.push_spans import (EngineCoords, PushSpans, SlowApply, parse_slow_apply,
                                      slow_apply_of)
from miles.record.timeline import Span, TimelineWriter, read_spans
from miles.run.engine_stragglers import KEY, SpanTail, engine_own_seconds, engine_time_metrics
from miles.run.faults import FaultInjector, check_faults, parse_faults


def test_the_slow_engine_fault_is_parsed_checked_and_passed_to_its_engine(tmp_path):
    spec = "raise@0,slow-engine-apply:1:0.5@2"
    assert slow_apply_of(spec, 1) == "0.5@3"  # the push after rollout 2 is version 3
    assert slow_apply_of(spec, 0) is None and slow_apply_of(None, 0) is None
    assert slow_apply_of("slow-engine-apply:0@1", 0) == "1@2"
    assert parse_faults(spec)[1].name == "slow-engine-apply:1:0.5@2"
    for bad in ("slow-engine-apply@1", "slow-engine-apply:x@1", "slow-engine-apply:1:fast@1"):
        with pytest.raises(ConfigError, match="slow-engine-apply:ENGINE"):
            parse_faults(bad)
    check_faults(spec, world_size=1, engines=2)
    with pytest.raises(ConfigError, match="no engine 1"):
        check_faults(spec, world_size=1, engines=1)
    with pytest.raises(ConfigError, match="only the embedded engine"):
        check_faults(spec, world_size=1, engines=2, embedded=False)
    FaultInjector(spec.split(",")[1], tmp_path).before_iteration(2)  # fired by the engine
    assert not (tmp_path / "faults").exists()
    config = parse_config(["--run-dir", str(tmp_path / "run"), "--inject-fault", spec,
                           "--rollout-num-engines", "2"])
    assert engine_args(config, 1)[-4:] == ["--engine-index", "1", "--inject-slow-apply", "0.5@3"]
    assert engine_args(config, 0)[-2:] == ["--engine-index", "0"]
    assert parse_slow_apply("0.5@3") == SlowApply(0.5, 3)
    assert SlowApply(0.5, 3).hits("4") and not SlowApply(0.5, 3).hits("2")
    assert not SlowApply(0.5, 3).hits("v4") and not SlowApply(0.5, 3).hits(None)
    with pytest.raises(ConfigError, match="--inject-slow-apply"):
        parse_slow_apply("3")


def test_a_wait_between_buckets_is_written_only_within_one_push(tmp_path):
    writer = TimelineWriter(tmp_path / "timeline.jsonl", lane="engine 127.0.0.1:1")
    spans = PushSpans(writer, EngineCoords(2, "http://127.0.0.1:1"))
    spans.bucket_arrived("g", 1.0)  # a push's first bucket: nothing to wait since
    spans.bucket_answered("g", staged=True)
    spans.bucket_arrived("g", spans._answered["g"] + 0.5)
    spans.bucket_answered("g", staged=False)  # the last (or a failed) bucket
    spans.bucket_arrived("g", 99.0)  # the next push's first bucket
    (wait,) = read_spans(tmp_path / "timeline.jsonl")
    assert wait.name == "wait" and wait.end - wait.start == pytest.approx(0.5)
    assert wait.args == {"kind": "wait", "url": "http://127.0.0.1:1", "engine": 2,
                         "coords": "engine2 http://127.0.0.1:1", "phase": "receive", "group": "g"}
    silent = PushSpans(TimelineWriter(None), EngineCoords(None, "http://127.0.0.1:1"))
    with silent.span("receive"):  # no run timeline: nothing written, nothing fails
        pass


def test_the_engine_metrics_of_one_and_three_engines():
    assert engine_time_metrics({}) == {}
    assert engine_time_metrics({0: 0.2}) == {KEY + "min": 0.2, KEY + "p50": 0.2, KEY + "max": 0.2}
    three = engine_time_metrics({0: 0.2, 1: 0.9, 2: 0.3})
    assert three == {KEY + "min": 0.2, KEY + "p50": 0.3, KEY + "max": 0.9, KEY + "slowest": 1.0}


def test_a_span_tail_reads_only_what_came_after_it(tmp_path):
    path = tmp_path / "timeline.jsonl"
    writer = TimelineWriter(path, lane="engine 127.0.0.1:1")
    writer.add("decode", 1.0, 2.0)  # before the push
    tail = SpanTail(path)
    writer.add("receive", 3.0, 4.0, kind="compute")
    with path.open("a") as f:
        f.write('{"lane":"engine 127.0.0.1:1","name":"apply"')  # still being written
    assert [s.name for s in tail.spans()] == ["receive"]
    assert SpanTail(None).spans() == [] and SpanTail(tmp_path / "none.jsonl").spans() == []


def test_buckets_of_two_stage_groups_received_at_once_count_once():
    def span(start, end, name="receive", kind="compute", engine=0):
        return Span("engine 127.0.0.1:1", name, start, end, None, {"kind": kind, "engine": engine})

    spans = [span(0.0, 1.0), span(0.5, 1.5), span(2.0, 2.5, "apply"),  # stages 0 and 1 overlap
             span(1.5, 2.0, "wait", "wait"), span(0.0, 9.0, "decode", "compute"),
             span(0.0, 0.25, engine=1)]
    assert engine_own_seconds(spans, []) == {0: 2.0, 1: 0.25}
