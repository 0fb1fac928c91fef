"""The engine's decoding as spans in a run's timeline (`--timeline-path`): one per stretch of batches
decoded with short gaps."""
from __future__ import annotations

import subprocess
import sys
import time

from miles.record.timeline import read_spans
from tests.support.engines import post_while_paused
from tests.support.wait import wait_for


def test_batches_with_short_gaps_are_one_span(engine, engine_dir):
    path = engine_dir / "timeline.jsonl"
    sent_at = time.time()
    bodies = [{"text": f"{i}+1=", "sampling_params": {"temperature": 0, "max_new_tokens": 4}} for i in range(4)]
    assert all(r.status_code == 200 for r in post_while_paused(engine.url, "/generate", bodies))
    # written once the engine has idled IDLE_GAP_S after the stretch (an earlier test's stretch may
    # have joined it if it ended less than IDLE_GAP_S before)
    # (the pause and continue around them are spans of their own: miles.engines.push_spans)
    spans = wait_for(lambda: [s for s in read_spans(path) if s.end >= sent_at and "kind" not in s.args],
                     60, "the decode span")
    assert len(spans) == 1 and spans[0].lane == f"engine 127.0.0.1:{engine.port}"
    assert spans[0].name == "decode" and spans[0].rollout_id is None and spans[0].start <= spans[0].end
    assert spans[0].args["requests"] >= 4 and spans[0].args["tokens"] >= 4 and spans[0].args["batches"] >= 1


def test_sglang_engine_rejects_the_timeline_flag(base_model, tmp_path):
    done = subprocess.run([sys.executable, "-m", "miles.engines.cli", "--engine", "sglang", "--model", str(base_model),
                           "--timeline-path", str(tmp_path / "t.jsonl")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--timeline-path" in done.stderr
