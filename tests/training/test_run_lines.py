"""What the trainer prints around a chunk boundary and an eval: a healthy chunk hand-off is not a resume,
and an eval says what it evaluates before its pause and what came out after it."""
from __future__ import annotations

from pathlib import Path

import pytest

from miles.record.journal import JournalLine
from miles.record.row import format_eval_result
from miles.run.checkpoint import resume_message

CKPT = Path("/r/checkpoints/iter_0000009")


def lines(*ids):
    return [JournalLine(i, 0.0, {}) for i in ids]


def test_a_chunk_that_starts_at_its_checkpoint_continues():
    assert resume_message(CKPT, 9, lines(-1, *range(10))) == f"[trainer] continuing from {CKPT} (rollout 9)"


def test_a_run_whose_journal_went_past_its_checkpoint_resumes_and_says_what_is_redone():
    text = resume_message(CKPT, 9, lines(-1, *range(13)))
    assert text == f"[trainer] resumed from {CKPT} (rollout 9) after an interruption: redoing rollouts 10..12"
    assert resume_message(CKPT, 9, lines(*range(11))).endswith("redoing rollout 10")


def test_an_eval_result_names_each_pass_at_k_with_its_base():
    text = format_eval_result("eval after rollout 19:", {"eval/arithmetic": 0.6, "eval/arithmetic-pass@1": 0.613,
                                                         "eval/arithmetic-pass@2": 0.7, "eval/step": 19.0},
                              {"eval/arithmetic-pass@1": 0.229})
    assert text == ("[trainer] eval after rollout 19: eval/arithmetic-pass_at_1=0.613 (base 0.229) "
                    "eval/arithmetic-pass_at_2=0.700")


def test_python_m_miles_train_says_where_to_look_before_the_long_work(tmp_path, capsys, monkeypatch):
    import miles.prepare
    from miles.train import main

    class ModelStep(Exception):
        pass

    def make_base_model(config):  # the long first step (the tiny model's build): what was printed by now?
        raise ModelStep(capsys.readouterr().out)

    monkeypatch.setattr(miles.prepare, "make_base_model", make_base_model)
    with pytest.raises(ModelStep) as printed:
        main(["--run-dir", str(tmp_path / "r")])
    out = printed.value.args[0]
    assert out.startswith(f"[trainer] run dir {tmp_path / 'r'} (journal {tmp_path / 'r' / 'metrics.jsonl'})")
    assert f"dashboard {tmp_path / 'r'} --follow" in out
