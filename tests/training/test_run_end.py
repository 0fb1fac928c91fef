"""One reader of a run's end: `scorecard()` reads the journal and the health log once, and the
flow's `finish_run` publishes its parts (finish_run read them again, with its own code)."""
from __future__ import annotations

import json
from pathlib import Path

from miles.record.journal import Journal, JournalLine, read_journal
from miles.record.layout import RunLayout
from miles.run.scorecard import base_metrics, red_flags_of, scorecard

ROOT = Path(__file__).resolve().parents[2]


def write_run(run_dir: Path, health_lines=()) -> None:
    """A base eval line, three trained rollouts watched on grad_norm, base_eval.json and the health log."""
    journal = Journal(run_dir)
    journal.append(JournalLine(-1, 100.0, {"eval/arithmetic-pass_at_1": 0.229, "eval/step": 0.0}))
    for rollout_id in range(3):
        journal.append(JournalLine(rollout_id, 110.0 + rollout_id, {"health/grad_norm": float(rollout_id > 0)}))
    (run_dir / "base_eval.json").write_text(json.dumps({"eval/arithmetic-pass@1": 0.229}))
    RunLayout(run_dir).health.write_text("".join(json.dumps(v) + "\n" for v in health_lines))


def test_the_red_flag_lines_and_warnings_come_from_the_one_reader(tmp_path):
    red = {"signal": "grad_norm", "severity": "red", "message": "at or above clip_grad",
           "values": {"train/grad_norm": 3.5}}
    write_run(tmp_path, [{**red, "rollout_id": 1}, {**red, "rollout_id": 2},
                         {"rollout_id": 2, "signal": "stall", "severity": "warning", "message": "m", "values": {}}])
    flags = red_flags_of(read_journal(RunLayout(tmp_path).journal), tmp_path)
    assert flags.lines == ["`grad_norm` from rollout 1 (2 rollouts): at or above clip_grad (train/grad_norm=3.5)"]
    assert flags.warnings == ["stall"] and flags.red == {"grad_norm": [1, 2]}
    assert scorecard(tmp_path).flags == flags  # what the card prints is what the flow publishes


def test_the_base_eval_is_the_file_with_the_journals_base_line_over_it(tmp_path):
    write_run(tmp_path)
    (tmp_path / "base_eval.json").write_text(json.dumps({"eval/arithmetic-pass@1": 0.1, "eval/other": 0.5}))
    base = base_metrics(tmp_path, read_journal(RunLayout(tmp_path).journal))
    assert base["eval/arithmetic-pass_at_1"] == 0.229  # the journal's base line wins
    assert base["eval/other"] == 0.5  # what only the file holds is kept


def test_finish_run_reads_nothing_of_the_run_end_itself():
    source = (ROOT / "tasks" / "finish.py").read_text()
    assert "read_health_log" not in source and "read_base_eval" not in source and "severity" not in source
    assert "read_journal" not in source and "red_flags_of" not in source  # scorecard() reads them


def test_the_card_holds_what_the_flow_publishes(tmp_path):
    """finish_run publishes the final-metrics table, the health artifact and the card from one
    scorecard(): its final row, the base eval and the red flags are parts of the card."""
    write_run(tmp_path)
    card = scorecard(tmp_path)
    assert card.final_rollout == 2 and card.final_metrics == {"health/grad_norm": 1.0}
    assert card.base_metrics["eval/arithmetic-pass_at_1"] == 0.229 and card.iterations == 3
    assert card.flags.watched and card.flags.lines == []
