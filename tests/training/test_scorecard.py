"""The scorecard at the end of a run: every figure read back from the run's own files, and said to be
missing when a file does not hold it (never made up)."""
from __future__ import annotations

import json

import pytest

from miles.dashboard.run_files import RunFiles
from miles.record.journal import Journal, JournalLine, base_eval_json
from miles.record.layout import RunLayout
from miles.run.scorecard import scorecard

HEALTH = {f"health/{s}": 0.0 for s in ("loss", "grad_norm", "raw_reward")}


def write_run(run_dir, health_lines=()):
    journal = Journal(run_dir)
    journal.append(JournalLine(-1, 100.0, {"eval/arithmetic-pass_at_1": 0.229, "eval/step": 0.0}))
    for rollout_id, reward in enumerate([0.27, 0.5, 0.83]):
        metrics = {"rollout/raw_reward": reward, **HEALTH}
        if rollout_id == 2:
            metrics["eval/arithmetic-pass_at_1"] = 0.796
        journal.append(JournalLine(rollout_id, 110.0 + 10 * rollout_id, metrics))
    (run_dir / "base_eval.json").write_text(json.dumps({"eval/arithmetic-pass@1": 0.229}))
    (RunLayout(run_dir).checkpoints / "iter_0000002").mkdir(parents=True)
    (RunLayout(run_dir).checkpoints / "iter_0000001").mkdir(parents=True)
    if health_lines:
        RunLayout(run_dir).health.write_text("".join(json.dumps(v) + "\n" for v in health_lines))


def test_a_healthy_run_reads_base_to_final_reward_time_flags_and_model(tmp_path):
    write_run(tmp_path)
    card = scorecard(tmp_path, seconds=295, next_steps=[("health", "miles doctor X")])
    rows = dict(card.rows())
    assert rows["held-out eval"] == "eval/arithmetic-pass_at_1: 0.229 (base) -> 0.796 (after rollout 2), +0.567"
    assert rows["reward"] == "rollout/raw_reward: 0.270 (rollout 0) -> 0.830 (rollout 2)"
    assert rows["rollouts"] == "3 (0..2) in 4m55s wall time (training 30s)"  # base eval line to the last one
    assert rows["red flags"] == "none (3 signals checked)"
    assert rows["model"] == str(tmp_path / "checkpoints" / "iter_0000002")  # the newest, not the first found
    assert rows["health"] == "miles doctor X"
    assert card.text().splitlines()[0] == f"scorecard of {tmp_path}"
    assert "| held-out eval | eval/arithmetic-pass_at_1: 0.229 (base) -> 0.796" in card.markdown()


def test_red_flags_are_counted_per_signal_from_health_jsonl(tmp_path):
    red = {"signal": "grad_norm", "severity": "red", "message": "m", "values": {}}
    write_run(tmp_path, [{**red, "rollout_id": 1}, {**red, "rollout_id": 2},
                         {"rollout_id": 2, "signal": "stall", "severity": "warning", "message": "m", "values": {}}])
    assert dict(scorecard(tmp_path).rows())["red flags"] == "2 on 1 signal: grad_norm at rollout 1, 2; warnings on stall"


def test_what_the_files_do_not_hold_is_said_missing(tmp_path):
    rows = dict(scorecard(tmp_path).rows())  # an empty run dir: nothing trained, nothing invented
    assert rows == {"held-out eval": "no eval in the journal", "reward": "no rollout/raw_reward in the journal",
                    "rollouts": "none trained", "red flags": "not watched (no health/* in the journal)",
                    "model": "no checkpoint saved"}


def test_without_a_measured_wall_time_the_journal_span_is_named_as_such(tmp_path):
    write_run(tmp_path)
    assert dict(scorecard(tmp_path).rows())["rollouts"] == "3 (0..2); 30s from the first to the last journal line"


@pytest.mark.parametrize("written", ["journal names", "old pass@k names"])
def test_base_eval_json_has_the_journal_names_and_old_files_still_read(tmp_path, written):
    evaluated = {"eval/arithmetic-pass@1": 0.229, "eval/arithmetic-pass@4": 0.5, "eval/step": 0.0}
    text = base_eval_json(evaluated) if written == "journal names" else json.dumps(evaluated)
    if written == "journal names":  # what the trainer writes: the names of the journal's base-eval line
        assert sorted(json.loads(text)) == ["eval/arithmetic-pass_at_1", "eval/arithmetic-pass_at_4", "eval/step"]
    journal = Journal(tmp_path)  # no base-eval line in the journal: the scorecard's base is the file's
    journal.append(JournalLine(0, 110.0, {"rollout/raw_reward": 0.5, "eval/arithmetic-pass_at_1": 0.3}))
    (tmp_path / "base_eval.json").write_text(text)
    assert dict(scorecard(tmp_path).rows())["held-out eval"].startswith("eval/arithmetic-pass_at_1: 0.229 (base)")
    assert RunFiles(tmp_path).base_eval()["eval/arithmetic-pass_at_4"] == 0.5
