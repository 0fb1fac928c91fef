"""Odd or hostile files in the compared run dirs and histories: a clear exit code, never a traceback or a hang."""
from __future__ import annotations

import json
import os

from compare_helpers import compare_json, copy_run, miles


def test_a_fifo_journal_or_record_exits_3_without_hanging(tmp_path):
    base = copy_run(tmp_path / "base")
    run = copy_run(tmp_path / "run")
    (run / "metrics.jsonl").unlink()
    os.mkfifo(run / "metrics.jsonl")
    done = miles("compare", base, run)  # the FIFO is a baseline's journal
    assert done.returncode == 3 and "not a regular file" in done.stderr
    history = tmp_path / "history"
    history.mkdir()
    os.mkfifo(history / "trusted.json")
    done = miles("doctor", base, "--history", history)
    assert done.returncode == 3 and "trusted.json" in done.stderr and "Traceback" not in done.stderr


def test_odd_eval_prompt_files_are_skipped(tmp_path):
    base = copy_run(tmp_path / "base")
    run = copy_run(tmp_path / "run")
    for r in (base, run):
        (r / "samples" / "eval").mkdir()
        row = {"eval_set": "arithmetic", "eval_step": 3, "prompt": "1+1=", "label": "2", "rewards": [1, 0],
               "pass_rate": 0.5 if r is base else 1.0}
        (r / "samples" / "eval" / "rollout_000003.jsonl").write_text(
            json.dumps(row) + "\n" + "garbage\n" + json.dumps({**row, "pass_rate": "high"}) + "\n[1]\n"
            + json.dumps({**row, "prompt": "torn"}))  # the last line has no newline: still being written
    os.mkfifo(run / "samples" / "eval" / "rollout_000004.jsonl")
    code, report = compare_json(run, base)
    assert code == 0
    assert [(c["prompt"], c["delta"]) for c in report["prompts"]["changes"]] == [("1+1=", 0.5)]


def test_a_binary_journal_has_every_value_missing(tmp_path):
    base = copy_run(tmp_path / "base")
    run = copy_run(tmp_path / "run")
    (run / "metrics.jsonl").write_bytes(bytes(range(256)) * 4)
    code, report = compare_json(run, base)
    assert code == 1 and all(s["verdict"] == "error" and s["why"] == "missing" for s in report["signals"]
                             if s["key"] in report["failed"])
