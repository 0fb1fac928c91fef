"""The engine's decoding as spans in a run's timeline (`--timeline-path`): one per stretch of batches
decoded back to back."""
from __future__ import annotations

import subprocess
import sys

from miles.tracking.timeline import read_spans
from tests.engines.conftest import post_while_paused


def test_back_to_back_batches_are_one_span(engine, engine_dir):
    path = engine_dir / "timeline.jsonl"
    before = len(read_spans(path))
    bodies = [{"text": f"{i}+1=", "sampling_params": {"temperature": 0, "max_new_tokens": 4}} for i in range(4)]
    assert all(r.status_code == 200 for r in post_while_paused(engine.url, "/generate", bodies))
    spans = read_spans(path)[before:]
    assert spans and {s.lane for s in spans} == {f"engine 127.0.0.1:{engine.port}"}
    assert {s.name for s in spans} == {"decode"} and all(s.rollout_id is None for s in spans)
    # decoded together in one batch, then the queue ran dry: one span for the four
    assert [(s.args["batches"], s.args["requests"]) for s in spans] == [(1, 4)]
    assert spans[0].args["tokens"] >= 4 and spans[0].start <= spans[0].end


def test_sglang_engine_rejects_the_timeline_flag(base_model, tmp_path):
    done = subprocess.run([sys.executable, "-m", "miles.engines.cli", "--engine", "sglang", "--model", str(base_model),
                           "--timeline-path", str(tmp_path / "t.jsonl")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--timeline-path" in done.stderr
