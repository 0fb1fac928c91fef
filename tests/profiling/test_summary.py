"""Trace reading: self time of nested operators, a target's slice of a trace, summaries on file."""
from miles.profiling.summary import (WindowSummary, append_summaries, read_summaries, slice_trace, span_totals,
                                     top_operators)


def op(name, ts, dur, tid=1, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur}


def test_self_time_subtracts_nested_operators_per_thread():
    events = [op("aten::linear", 0, 100), op("aten::mm", 10, 60), op("aten::add", 80, 10),
              op("aten::mm", 0, 50, tid=2),  # another thread: not nested in linear
              op("rollout", 0, 500, cat="user_annotation")]  # spans are not operators
    # linear: 100 - 60 - 10 = 30 us; mm: 60 + 50 = 110 us in 2 calls; add: 10 us
    assert top_operators(events) == [{"name": "aten::mm", "self_cpu_ms": 0.11, "calls": 2},
                                     {"name": "aten::linear", "self_cpu_ms": 0.03, "calls": 1},
                                     {"name": "aten::add", "self_cpu_ms": 0.01, "calls": 1}]


def test_span_totals_add_up_each_phase():
    events = [op("rollout", 0, 2000, cat="user_annotation"), op("rollout", 5000, 1000, cat="user_annotation"),
              op("actor_train", 2000, 500, cat="user_annotation"), op("other", 0, 9, cat="user_annotation")]
    assert span_totals(events) == {"rollout": 3.0, "actor_train": 0.5}


def test_slice_keeps_events_inside_the_intervals_and_metadata():
    meta = {"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "rank0"}}
    inside, straddling, outside = op("a", 12, 5), op("b", 18, 5), op("c", 40, 1)
    other_marker = op("mark-other", 10, 5, cat="user_annotation")
    sliced = slice_trace({"schemaVersion": 1, "traceEvents": [meta, inside, straddling, outside, other_marker]},
                         [(10, 20), (30, 35)], drop_names={"mark-other"})
    assert sliced["traceEvents"] == [meta, inside]
    assert sliced["schemaVersion"] == 1


def test_summaries_file_keeps_the_last_line_of_a_retried_window(tmp_path):
    first = WindowSummary("train_actor", 0, 10, 12, "profiler/x.json.gz", [], {"actor_train": 1.0})
    again = WindowSummary("train_actor", 0, 10, 12, "profiler/x.json.gz", [], {"actor_train": 2.0})
    later = WindowSummary("train_actor", 0, 30, 31, "profiler/y.json.gz", [], {})
    path = append_summaries(tmp_path, [first, later])
    append_summaries(tmp_path, [again])
    assert path == tmp_path / "profiler" / "summaries.jsonl"
    assert len(path.read_text().splitlines()) == 3
    assert read_summaries(tmp_path) == [again, later]
    assert read_summaries(tmp_path, 10, 12) == [again]
