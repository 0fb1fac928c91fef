"""The engine's decoding batches as spans in a run's timeline (`--timeline-path`)."""
from __future__ import annotations

import subprocess
import sys

from miles.tracking.timeline import read_spans
from tests.engines.conftest import post_while_paused


def test_each_decoding_batch_is_one_span(engine, engine_dir):
    path = engine_dir / "timeline.jsonl"
    before = len(read_spans(path))
    bodies = [{"text": f"{i}+1=", "sampling_params": {"temperature": 0, "max_new_tokens": 4}} for i in range(4)]
    assert all(r.status_code == 200 for r in post_while_paused(engine.url, "/generate", bodies))
    spans = read_spans(path)[before:]
    assert spans and {s.lane for s in spans} == {f"engine 127.0.0.1:{engine.port}"}
    assert {s.name for s in spans} == {"batch"} and all(s.rollout_id is None for s in spans)
    assert any(s.args["requests"] == 4 for s in spans)  # decoded together: one span for the four
    assert sum(s.args["tokens"] for s in spans) >= 4 and all(s.start <= s.end for s in spans)


def test_sglang_engine_rejects_the_timeline_flag(base_model, tmp_path):
    done = subprocess.run([sys.executable, "-m", "miles.engines.cli", "--engine", "sglang", "--model", str(base_model),
                           "--timeline-path", str(tmp_path / "t.jsonl")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--timeline-path" in done.stderr
