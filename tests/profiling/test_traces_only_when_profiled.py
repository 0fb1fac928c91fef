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
