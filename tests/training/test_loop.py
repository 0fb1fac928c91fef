"""The driver loop through `python -m miles.train`'s `train()` on real engines, router, Ray and trackers:
the eval before training at eval/step 0 everywhere, --save-interval, an observer stopping the run
cleanly, and the phase hook seeing the driver's phases."""
from __future__ import annotations

import json
from contextlib import contextmanager

import pytest

from miles.loop import Observer, save_due
from miles.run.phases import add_phase_hook, remove_phase_hook, timed
from miles.record.journal import read_journal
from tests.tracking.tracking_helpers import ALL_TRACKERS, assert_all_trackers_equal_journal
from tests.support.flags import SMALL


class StopAfter(Observer):
    def __init__(self, last: int):
        self.last, self.seen, self.ended = last, [], None

    def before_iteration(self, rollout_id: int) -> None:
        self.seen.append(("before", rollout_id))

    def after_iteration(self, result) -> str | None:
        self.seen.append(("after", result.rollout_id))
        return "enough for this test" if result.rollout_id == self.last else None

    def end(self, outcome) -> None:
        self.ended = outcome


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
def test_loop_logs_base_eval_saves_at_interval_and_stops_when_asked(tmp_path, ray_cluster):
    from miles.config import parse_config
    from miles.prepare import prepare_config
    from miles.train import train

    run_dir = tmp_path / "run"
    config = parse_config([*SMALL, "--num-rollout", "4", "--save-interval", "1", "--keep-checkpoints", "10",
                           "--run-dir", str(run_dir), "--wandb-mode", "offline", *ALL_TRACKERS])
    phases = []

    @contextmanager
    def hook(name):
        phases.append(name)
        yield

    stopper = StopAfter(1)
    add_phase_hook(hook)
    try:
        summary = train(prepare_config(config), observers=[stopper])
    finally:
        remove_phase_hook(hook)

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
