"""A run that did not profile still writes its pids (for `miles py-spy`) into RUN_DIR/profiler: that folder
is not "traces", so nothing may advertise or upload it as such."""
from __future__ import annotations

from miles.record.layout import RunLayout, has_traces


def test_bookkeeping_alone_is_no_trace(tmp_path):
    layout = RunLayout(tmp_path)
    assert not has_traces(layout.profiler)  # absent
    layout.profiler.mkdir()
    layout.profiler_processes.write_text('{"trainer": 1}')
    layout.profiler_requested.write_text("")
    assert not has_traces(layout.profiler)
    (layout.profiler / "rank0").mkdir()
    (layout.profiler / "rank0" / "trace.json").write_text("{}")
    assert has_traces(layout.profiler)


def test_the_services_file_every_run_writes_is_no_trace(tmp_path):
    """The first-hour review's E1: services.json (written by every run for `miles diagnose`) made every
    run print `traces` and upload profiler/ with the cluster's and services' addresses."""
    from miles.profiling.run_services import write_services

    layout = RunLayout(tmp_path)
    path = write_services(tmp_path, ["http://127.0.0.1:1"], "http://127.0.0.1:2")
    assert path.parent == layout.profiler
    layout.profiler_processes.write_text('{"trainer": 1}')
    assert not has_traces(layout.profiler)
    (layout.profiler / "summaries.jsonl").write_text("{}\n")
    assert has_traces(layout.profiler)
