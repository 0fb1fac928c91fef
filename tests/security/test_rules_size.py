"""Probe CR3: a rules file of 50,000 rules (as `miles compare --rules`, or a history dir's `rules.json`)
gave no answer in 300 s / 90 s: every key is matched against the rules in order on every line. Now a
file may hold at most MAX_RULES rules; more is one line naming the file and the limit, exit 2."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from miles.compare.rules import MAX_RULES

from tests.compare.compare_helpers import copy_run, miles

HISTORY = Path(__file__).resolve().parents[1] / "compare" / "history" / "default-short"


def rules_file(path: Path, count: int) -> Path:
    rules = [{"pattern": f"x{i}/*", "worse": "up", "rel": 0.5, "abs": 0.1} for i in range(count - 1)]
    rules.append({"pattern": "rollout/raw_reward", "worse": "down", "rel": 0.3, "abs": 0.1})
    path.write_text(json.dumps({"rules": rules}))
    return path


def test_a_rules_file_past_the_limit_is_one_line(tmp_path):
    run, baseline = copy_run(tmp_path / "run"), copy_run(tmp_path / "B")
    done = miles("compare", run, baseline, "--rules", rules_file(tmp_path / "r.json", 50_000))
    assert done.returncode == 2, done.stdout + done.stderr[-2000:]
    assert f"--rules: 50000 rules; at most {MAX_RULES}" in done.stderr and "Traceback" not in done.stderr


def test_a_history_rules_file_past_the_limit_is_one_line(tmp_path):
    history = tmp_path / "hist"
    shutil.copytree(HISTORY, history)
    rules_file(history / "rules.json", 50_000)
    done = miles("doctor", copy_run(tmp_path / "run"), "--history", history)
    assert done.returncode == 2, done.stdout + done.stderr[-2000:]
    assert f"rules.json: 50000 rules; at most {MAX_RULES}" in done.stderr and "Traceback" not in done.stderr


def test_a_rules_file_at_the_limit_is_judged_by(tmp_path):
    run, baseline = copy_run(tmp_path / "run"), copy_run(tmp_path / "B")
    done = miles("compare", run, baseline, "--rules", rules_file(tmp_path / "r.json", MAX_RULES))
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "rollout/raw_reward" in done.stdout

