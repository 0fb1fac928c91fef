"""The driver loop through `python -m miles.train`'s `train()` on real engines, router, Ray and trackers (the
session's plain run, tests/support/sessions.py; tests/training/test_run_loop.py has its rules with a fake):
the eval before training at eval/step 0 everywhere, --save-interval, an observer stopping the run
cleanly, and the phase hook seeing the driver's phases."""
from __future__ import annotations

import json
from contextlib import contextmanager

import pytest

from miles.loop import save_due
from miles.run.phases import add_phase_hook, remove_phase_hook, timed
from miles.record.journal import read_journal
from tests.support.sessions import PLAIN_RUN_TIMEOUT_S
from tests.tracking.tracking_helpers import assert_all_trackers_equal_journal


def test_save_due_honours_the_interval_and_the_range_end():
    assert [r for r in range(10) if save_due(r, 10, 3)] == [2, 5, 8, 9]
    assert [r for r in range(4, 8) if save_due(r, 8, None)] == [7]


def test_phases_are_named_and_hooked():
    seen, times = [], {}

    @contextmanager
    def hook(name):
        seen.append(name)
        yield

    add_phase_hook(hook)
    try:
        with timed("rollout", times):
            pass
    finally:
        remove_phase_hook(hook)
    with timed("eval", times):
        pass
    assert seen == ["rollout"] and set(times) == {"rollout", "eval"}
    with pytest.raises(ValueError, match="unknown phase"):
        with timed("rolout"):
            pass


@pytest.mark.slow
@pytest.mark.timeout(PLAIN_RUN_TIMEOUT_S)
def test_loop_logs_base_eval_saves_at_interval_and_stops_when_asked(plain_run):
    # the session's plain run (tests/support/sessions.py): --num-rollout 4 --save-interval 1, every tracker,
    # an observer that stops it after rollout 1, a phase hook
    summary, run_dir, stopper, phases = plain_run.summary, plain_run.run_dir, plain_run.stopper, plain_run.phases
    assert summary.stop_reason == "enough for this test" and summary.last_rollout_id == 1
    assert stopper.seen == [("before", 0), ("after", 0), ("before", 1), ("after", 1)]
    assert stopper.ended is not None and stopper.ended.rollout_ids == [0, 1]
    # --save-interval 1: a checkpoint after every rollout, including the one the observer stopped at
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["iter_0000000", "iter_0000001"]
    assert summary.checkpoint.name == "iter_0000001"

    lines = read_journal(run_dir / "metrics.jsonl")
    assert [ln.rollout_id for ln in lines] == [-1, 0, 1]
    base, first, second = (ln.metrics for ln in lines)
    assert base["eval/step"] == 0 and base["eval/arithmetic"] == pytest.approx(summary.base_eval["eval/arithmetic"])
    assert not any(k.startswith(("train/", "rollout/", "perf/")) for k in base)
    on_file = json.loads((run_dir / "base_eval.json").read_text())  # the journal's names, pass_at_1 not pass@1
    assert "eval/arithmetic-pass_at_1" in on_file and on_file.items() <= base.items()
    assert "eval/step" not in first and not any(k.startswith("eval/") for k in first)  # no eval after rollout 0
    assert second["eval/step"] == 1 and "eval/arithmetic" in second  # --eval-interval 2
    # the stop closed the trackers as the end of the run: every tracker equals the journal, base eval included
    points = assert_all_trackers_equal_journal(run_dir)
    assert [step for step, _ in points["eval/arithmetic"]] == [0, 1]
    assert (run_dir / "report.png").exists()
    assert {"rollout", "update_weights", "eval", "checkpoint"} <= set(phases)
