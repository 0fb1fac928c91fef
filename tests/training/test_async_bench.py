"""benchmarks/async.py's reading of a run: seconds from the start of training to the first eval at or above
the target (none when never reached), read off a recorded run's journal; the uncorrected-async refusal."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "dashboard" / "recorded_run"


def bench():
    spec = importlib.util.spec_from_file_location("async_bench", ROOT / "benchmarks" / "async.py")  # `async`: a keyword
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_time_to_target_reads_the_journal():
    b = bench()
    lines = [json.loads(x) for x in (RECORDED / "metrics.jsonl").read_text().splitlines()]
    key = "eval/arithmetic-pass_at_1"
    evals = [x for x in lines if key in x and x.get("rollout/step", -1) >= 0]
    low = b.time_to_target(RECORDED, 0.0)
    assert low["eval_key"] == key and low["final"] == evals[-1][key]
    assert low["reached_s"] is not None and 0 <= low["reached_s"] <= low["train_s"]
    assert b.time_to_target(RECORDED, 1.01)["reached_s"] is None  # never reached
    assert low["max_staleness"] == 0.0  # a synchronous run


def test_the_uncorrected_async_run_is_reported_refused():
    assert bench().uncorrected_refusal(1).startswith("refused: --max-weight-staleness")
