"""The project gates its own learning curve: `tests/compare/history/default-short/` holds the
trusted records of three real short default runs (GATE_RECORD: the first 8 rollouts of the default
run on two ranks, with its 100-rollout learning-rate schedule, eval every 4 on 64 prompts) and the
rules CI judges by. A run of today's code must stay inside their corridors in enforce mode (the
default run of tests/training/test_learning.py, whose first 8 rollouts are those), each trusted run
passes against the other two (the corridors are wide enough for run-to-run noise), and two real
broken learners fail: `--lr 0` (nothing learned) and a reward with its sign flipped (both recorded
with the gate's earlier flags, 8 rollouts on one rank, eval every 4 on 64 prompts: the schedule of
the learning rate is no part of either breakage).

Refresh the history after a change that moves the curve on purpose (see docs/user-guide/compare.md):
run GATE_RECORD three times and `miles doctor RUN --history DIR --history-add` each."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.history_gate import HISTORY, gate, outside

HERE = Path(__file__).parent
RECORDED = HERE / "recorded"  # real runs: a trusted one (short-1) and the two broken learners


def test_the_committed_history_is_compact_and_active():
    records = sorted(p for p in HISTORY.glob("*.json") if p.name != "rules.json")
    assert len(records) >= 3
    for p in records:
        assert p.stat().st_size < 16_000
        assert json.loads(p.read_text())["format"] == "miles-trusted-run/1"
    rules = json.loads((HISTORY / "rules.json").read_text())["rules"]
    assert {r["pattern"] for r in rules} >= {"rollout/raw_reward", "eval/*-pass_at_1"}


def test_each_trusted_run_passes_against_the_others(tmp_path):
    """Leave one out: the run-to-run noise of real runs stays inside the corridors of the other two."""
    records = sorted(p for p in HISTORY.glob("*.json") if p.name != "rules.json")
    run = RECORDED / "short-1"
    assert run.is_dir()
    others = tmp_path / "others"
    others.mkdir()
    shutil.copy(HISTORY / "rules.json", others)
    for p in records:
        if p.stem != "short-1":
            shutil.copy(p, others)
    code, report = gate(run, others)
    assert code == 0 and "2 trusted runs: passed" in report, report


@pytest.mark.parametrize("name,signals", [
    ("lr-zero", {"rollout/raw_reward", "eval/arithmetic-pass_at_1"}),
    ("sign-flip", {"rollout/raw_reward"}),
])
def test_a_broken_learner_fails_the_gate(name, signals):
    code, report = gate(RECORDED / name)
    assert code == 1 and "FAILED" in report, report
    failed = outside(report)
    assert signals & set(failed), report
    if name == "sign-flip":
        assert failed["rollout/raw_reward"] == 0  # the reward is negative from the first rollout
