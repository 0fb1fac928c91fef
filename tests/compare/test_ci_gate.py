"""The project gates its own learning curve: `tests/compare/history/default-short/` holds the trusted records
of three real short default runs (8 rollouts, eval every 4 on 64 prompts) and the rules CI judges by. A
run of today's code must stay inside their corridors in enforce mode (the slow test runs one), each trusted
run passes against the other two (the corridors are wide enough for run-to-run noise), and two real broken
learners recorded with the same flags fail: `--lr 0` (nothing learned) and a reward with its sign flipped.

Refresh the history after a change that moves the curve on purpose (see docs/user-guide/compare.md):
run GATE_FLAGS three times and `miles doctor RUN --history DIR --history-add` each."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from compare_helpers import miles

HERE = Path(__file__).parent
HISTORY = HERE / "history" / "default-short"
RECORDED = HERE / "recorded"  # real runs of GATE_FLAGS: a trusted one and the two broken learners
GATE_FLAGS = ["--num-rollout", "8", "--eval-interval", "4", "--eval-max-prompts", "64"]


def gate(run_dir: Path, history: Path = HISTORY) -> tuple[int, str]:
    done = miles("doctor", run_dir, "--history", history, "--history-mode", "enforce")
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout


def outside(report: str) -> dict[str, int]:
    """Signal -> first step, of the gate table's failed rows."""
    rows = [line.split() for line in report.splitlines() if " OUTSIDE " in line or " ERROR " in line]
    return {r[0]: int(r[2]) for r in rows}


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
    run = RECORDED / "default-1"
    assert run.is_dir()
    others = tmp_path / "others"
    others.mkdir()
    shutil.copy(HISTORY / "rules.json", others)
    for p in records:
        if p.stem != "default-1":
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


@pytest.mark.slow
def test_a_default_run_of_this_code_passes_the_gate(tmp_path, ray_cluster):
    """A real short run of the default config, gated in enforce mode against the committed history."""
    from miles.config import parse_config
    from miles.prepare import prepare_config
    from miles.train import train

    run_dir = tmp_path / "default-short"
    train(prepare_config(parse_config(["--run-dir", str(run_dir), *GATE_FLAGS])))
    code, report = gate(run_dir)
    assert code == 0 and "3 trusted runs: passed" in report, report
