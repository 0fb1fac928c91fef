"""`miles.loop.run_loop`'s rules in milliseconds, with a fake `LoopTrainer` (no engine, no Ray): where it
resumes, when it evaluates the base model, when it saves, how an observer stops it, and how it closes, on
success, on a stop and on an error. tests/training/test_loop.py checks the same loop through a real run."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from miles.health import HealthReport
from miles.loop import run_loop
from miles.run.observer import IterationResult, Observer


class FakeTrainer:
    """A `LoopTrainer` that records every call the loop makes, in order."""

    def __init__(self, num_rollout: int, save_interval: int | None = None, resumed_at: int = 0,
                 eval_sets=("arithmetic",), fail_at: int | None = None):
        self.config = SimpleNamespace(train=SimpleNamespace(save_interval=save_interval),
                                      rollout=SimpleNamespace(num_rollout=num_rollout))
        self.eval_sets = list(eval_sets)
        self.resumed_at, self.fail_at, self.calls = resumed_at, fail_at, []

    def resume(self) -> int:
        self.calls.append(("resume",))
        return self.resumed_at

    def evaluate_base(self) -> dict[str, float]:
        self.calls.append(("base_eval",))
        return {"eval/arithmetic": 0.25}

    def run_iteration(self, rollout_id: int) -> IterationResult:
        self.calls.append(("iteration", rollout_id))
        if rollout_id == self.fail_at:
            raise RuntimeError(f"rollout {rollout_id} failed")
        return IterationResult(rollout_id, {"rollout/step": float(rollout_id)}, [], HealthReport(rollout_id))

    def save_checkpoint(self, rollout_id: int) -> Path:
        self.calls.append(("save", rollout_id))
        return Path(f"iter_{rollout_id:07d}")

    def close(self, final: bool = True) -> None:
        self.calls.append(("close", final))

    def of(self, kind: str) -> list:
        return [call[1] if len(call) > 1 else None for call in self.calls if call[0] == kind]


class Recorder(Observer):
    """Records what it sees; stops the run after rollout `stop_after` with `reason`."""

    def __init__(self, stop_after: int | None = None, reason: str = "enough", fail_in_end: bool = False):
        self.stop_after, self.reason, self.fail_in_end = stop_after, reason, fail_in_end
        self.seen, self.ended = [], "not called"

    def before_iteration(self, rollout_id: int) -> None:
        self.seen.append(("before", rollout_id))

    def after_iteration(self, result: IterationResult) -> str | None:
        self.seen.append(("after", result.rollout_id))
        return self.reason if result.rollout_id == self.stop_after else None

    def end(self, outcome) -> None:
        self.ended = outcome
        if self.fail_in_end:
            raise RuntimeError("an observer failed at the end")


def test_a_fresh_run_evaluates_the_base_once_saves_at_the_interval_and_the_end_and_closes_finally():
    trainer = FakeTrainer(num_rollout=5, save_interval=2)
    watcher = Recorder()
    outcome = run_loop(trainer, range(0, 5), [watcher])
    assert trainer.calls[:2] == [("resume",), ("base_eval",)]
    assert trainer.of("iteration") == [0, 1, 2, 3, 4]
    assert trainer.of("save") == [1, 3, 4]  # every 2nd rollout, and the range's last
    assert trainer.calls[-1] == ("close", True) and trainer.of("close") == [True]
    assert outcome.resumed_at == 0 and outcome.rollout_ids == [0, 1, 2, 3, 4]
    assert outcome.base_eval == {"eval/arithmetic": 0.25} and outcome.last_metrics == {"rollout/step": 4.0}
    assert outcome.checkpoint == Path("iter_0000004") and outcome.stop_reason is None
    assert watcher.seen == [(kind, r) for r in range(5) for kind in ("before", "after")]
    assert watcher.ended is outcome


def test_without_eval_sets_or_save_interval_it_saves_only_at_the_end():
    trainer = FakeTrainer(num_rollout=3, eval_sets=())
    outcome = run_loop(trainer, range(0, 3))
    assert trainer.of("base_eval") == [] and outcome.base_eval == {}
    assert trainer.of("save") == [2]


def test_a_resumed_run_starts_past_its_checkpoint_without_a_base_eval():
    trainer = FakeTrainer(num_rollout=6, save_interval=4, resumed_at=3)
    outcome = run_loop(trainer, range(0, 6))
    assert trainer.of("base_eval") == []
    assert trainer.of("iteration") == [3, 4, 5] and outcome.resumed_at == 3 and outcome.rollout_ids == [3, 4, 5]
    assert trainer.of("save") == [3, 5]
    assert trainer.of("close") == [True]


def test_a_chunk_before_the_last_saves_at_its_end_and_does_not_close_the_run():
    trainer = FakeTrainer(num_rollout=6, resumed_at=2)
    outcome = run_loop(trainer, range(2, 4))  # the flow's second chunk of 2
    assert trainer.of("base_eval") == []  # only the run's first chunk evaluates the base model
    assert trainer.of("iteration") == [2, 3] and trainer.of("save") == [3]
    assert trainer.of("close") == [False] and outcome.checkpoint == Path("iter_0000003")


def test_a_chunk_whose_rollouts_are_all_checkpointed_runs_nothing():
    trainer = FakeTrainer(num_rollout=6, resumed_at=4)
    outcome = run_loop(trainer, range(2, 4))  # a retried chunk that had already saved its end
    assert trainer.of("iteration") == [] and trainer.of("save") == [] and outcome.rollout_ids == []
    assert trainer.of("close") == [False]


def test_the_first_chunk_evaluates_the_base_model_only_when_nothing_is_checkpointed():
    trainer = FakeTrainer(num_rollout=6)
    run_loop(trainer, range(0, 2))
    assert trainer.of("base_eval") == [None] and trainer.of("close") == [False]
    # a later chunk with nothing checkpointed starts at its own first rollout, without a base eval
    trainer = FakeTrainer(num_rollout=6)
    outcome = run_loop(trainer, range(2, 4))
    assert trainer.of("base_eval") == [] and outcome.rollout_ids == [2, 3]


def test_an_observer_stops_the_run_cleanly_after_saving_the_rollout_it_stopped_at():
    trainer = FakeTrainer(num_rollout=10, save_interval=5)
    first, second, third = Recorder(stop_after=2, reason="red flag"), Recorder(stop_after=2, reason="asked"), Recorder()
    outcome = run_loop(trainer, range(0, 10), [first, second, third])
    assert trainer.of("iteration") == [0, 1, 2]
    assert trainer.of("save") == [2]  # not due by the interval: saved because the run stops there
    assert outcome.stop_reason == "red flag; asked" and outcome.checkpoint == Path("iter_0000002")
    # a stopped run is over: the trackers are closed as its end although the range went on
    assert trainer.of("close") == [True]
    # every observer sees every call, also after another one asked to stop
    for watcher in (first, second, third):
        assert watcher.seen == [(kind, r) for r in range(3) for kind in ("before", "after")]
        assert watcher.ended is outcome


def test_an_error_ends_every_observer_with_the_partial_outcome_closes_the_trainer_and_propagates():
    trainer = FakeTrainer(num_rollout=8, save_interval=1, fail_at=2)
    watcher = Recorder()
    with pytest.raises(RuntimeError, match="rollout 2 failed"):
        run_loop(trainer, range(0, 4), [watcher])  # a chunk short of --num-rollout
    assert trainer.of("save") == [0, 1]
    assert watcher.ended is not None and watcher.ended.rollout_ids == [0, 1] and watcher.ended.stop_reason is None
    assert trainer.calls[-1] == ("close", False)  # not the end of the run: the retried chunk resumes it
    # whether the close is final follows the range, on an error too: a range that reaches --num-rollout is the
    # run's last, and its close is final
    trainer = FakeTrainer(num_rollout=4, fail_at=2)
    with pytest.raises(RuntimeError, match="rollout 2 failed"):
        run_loop(trainer, range(0, 4))
    assert trainer.calls[-1] == ("close", True)


def test_an_error_in_resume_still_ends_the_observers_and_closes_the_trainer():
    trainer = FakeTrainer(num_rollout=6)
    trainer.resume = lambda: (_ for _ in ()).throw(OSError("no checkpoint dir"))
    watcher = Recorder()
    with pytest.raises(OSError, match="no checkpoint dir"):
        run_loop(trainer, range(0, 3), [watcher])
    assert watcher.ended is None and trainer.of("iteration") == []
    assert trainer.of("close") == [False]


def test_an_observer_failing_at_the_end_still_lets_the_trainer_close():
    trainer = FakeTrainer(num_rollout=2)
    with pytest.raises(RuntimeError, match="an observer failed at the end"):
        run_loop(trainer, range(0, 2), [Recorder(fail_in_end=True)])
    assert trainer.of("close") == [True]


def test_a_fault_listed_in_inject_fault_fails_the_loop_at_its_rollout_once(tmp_path):
    from miles.run.faults import FaultInjector, InjectedFault

    trainer = FakeTrainer(num_rollout=4)
    injector = FaultInjector("raise@1,raise@3", tmp_path)
    with pytest.raises(InjectedFault, match="raise@1"):
        run_loop(trainer, range(0, 4), [injector])
    trainer.resumed_at = 1  # the retry resumes from rollout 0's checkpoint (the fake's save is not on disk)
    with pytest.raises(InjectedFault, match="raise@3"):
        run_loop(trainer, range(0, 4), [injector])
    trainer.resumed_at = 3
    outcome = run_loop(trainer, range(0, 4), [injector])  # both fired: the third try finishes
    assert outcome.rollout_ids == [3] and trainer.of("iteration") == [0, 1, 2, 3]
