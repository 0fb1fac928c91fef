"""The two rollout sources on fakes (no engine, no trainer), in milliseconds: `SyncRollouts` makes each
rollout when asked, from the next prompts; `AsyncRollouts` takes them from a producer bounded by K, and
a checkpoint saves the cursor of the rollout trained, not the producer's (it may have drawn ahead)."""
from __future__ import annotations

import asyncio
import threading

import pytest

from miles.config import parse_config
from miles.record.journal import JournalLine
from miles.rollout.data import DataSource, Prompt
from miles.rollout.sample import Sample
from miles.run.rollout_source import AsyncRollouts, SyncRollouts, rollout_source
from miles.run.staleness_guard import TIGHTENED

BATCH = 2
ASYNC = ["--max-weight-staleness", "1", "--use-tis"]


def data(n: int = 20) -> DataSource:
    return DataSource([Prompt(f"p{i}", str(i)) for i in range(n)], seed=7)


class Maker:
    """A `RolloutMaker`: one sample per prompt, carrying the version its request was admitted under (as
    the engine reports it); `hold` keeps a rollout's generation waiting until the test lets it go."""

    def __init__(self, served=None, hold: dict[int, threading.Event] | None = None):
        self.calls: list[tuple[int, list[str], object]] = []
        self.served, self.hold = served or (lambda: 0), hold or {}

    def __call__(self, rollout_id, prompts, tokenizer, admit=None):
        self.calls.append((rollout_id, [p.prompt for p in prompts], tokenizer))
        if admit is not None:
            asyncio.run(admit())
        if rollout_id in self.hold:
            self.hold[rollout_id].wait()
        samples = [Sample(index=i, group_index=i, prompt=p.prompt, label=p.label,
                          weight_version=str(self.served())) for i, p in enumerate(prompts)]
        return samples, [float(rollout_id)] * len(samples)


def test_sync_makes_each_rollout_when_taken_from_the_next_prompts():
    source, reference, make = data(), data(), Maker()
    rollouts = SyncRollouts(source, BATCH, make, tokenizer="tok")
    assert rollouts.pause_mode is None  # nothing generates during a push: nothing to pause
    for j in range(3):
        rollout = rollouts.take(j)
        expected = [p.prompt for p in reference.next_batch(BATCH)]
        assert make.calls[-1] == (j, expected, "tok")
        assert [s.prompt for s in rollout.samples] == expected and rollout.advantages == [float(j)] * BATCH
        assert rollout.metrics(step_time=1.0) == {}
        rollouts.pushed(j + 1)
        assert rollouts.observe(j, {"train/mismatch_kl": 9.0}) == {}
        assert rollouts.cursor() == reference.state_dict()  # the cursor after the rollout trained
    assert len(make.calls) == 3  # nothing made ahead


@pytest.mark.parametrize("flags, kind", [([], SyncRollouts), (["--fully-async"], AsyncRollouts),
                                         (ASYNC, AsyncRollouts), ([*ASYNC, "--fully-async"], AsyncRollouts)])
def test_staleness_zero_without_fully_async_is_the_synchronous_source(flags, kind):
    train = parse_config(flags).train
    assert type(rollout_source(train, data(), BATCH, Maker(), "tok", lambda: "own")) is kind


def test_async_waits_for_each_push_at_staleness_zero_and_reports_its_rollouts():
    served = {"version": 0}
    make = Maker(served=lambda: served["version"])
    rollouts = AsyncRollouts(parse_config(["--fully-async"]).train, data(), BATCH, make, lambda: "own")
    assert rollouts.pause_mode == "in_place"
    for j in range(3):
        rollout = rollouts.take(j)
        assert make.calls[j][0] == j and make.calls[j][2] == "own"  # the producer's own tokenizer
        assert {s.weight_version for s in rollout.samples} == {str(j)}  # made after the push of j - 1
        metrics = rollout.metrics(step_time=2.0)
        assert metrics["rollout/staleness/max"] == 0 and metrics["rollout/max_weight_staleness"] == 0
        assert metrics["rollout/buffer_size"] == 1 and 0 <= metrics["perf/trainer_idle_ratio"]
        served["version"] = j + 1
        rollouts.pushed(j + 1)
    rollouts.stop()
    assert rollouts.producer is None and [c[0] for c in make.calls] == [0, 1, 2]


def test_async_checkpoints_the_cursor_of_the_rollout_trained_not_the_producers():
    drew_ahead, release = threading.Event(), threading.Event()
    source, make = data(), Maker(hold={1: release})
    draw = source.next_batch

    def next_batch(size):  # the test waits for the producer's second draw (rollout 1, one version ahead)
        batch = draw(size)
        if source.offset >= 2 * size:
            drew_ahead.set()
        return batch

    source.next_batch = next_batch
    rollouts = AsyncRollouts(parse_config(ASYNC).train, source, BATCH, make, lambda: None)
    try:
        rollouts.take(0)
        assert drew_ahead.wait(timeout=30)
        assert source.state_dict() == {"epoch": 0, "offset": 4}
        assert rollouts.cursor() == {"epoch": 0, "offset": 2}  # rollout 0's, which is what was trained
    finally:
        release.set()
        rollouts.stop()


def test_async_guard_tightens_the_bound_and_a_restart_reads_it_back():
    train = parse_config([*ASYNC, "--staleness-guard", "--staleness-guard-max-mismatch-kl", "0.01"]).train
    rollouts = AsyncRollouts(train, data(), BATCH, Maker(), lambda: None)
    assert rollouts.observe(0, {"train/mismatch_kl": 1.0}) == {}  # no producer yet: nothing to tighten
    rollouts.take(0)
    out = rollouts.observe(0, {"train/mismatch_kl": 1.0})
    assert out[TIGHTENED] == 1.0 and rollouts.max_staleness == 0 == rollouts.producer.max_staleness
    rollouts.stop()
    journal = [JournalLine(0, 0.0, {"rollout/max_weight_staleness": 1.0}),
               JournalLine(1, 0.0, {"rollout/max_weight_staleness": 0.0})]
    rollouts.restart(5, journal, 0)  # rollout 1 is redone: its tightening is not kept
    assert (rollouts.version, rollouts.max_staleness) == (5, 1)
    rollouts.take(1)  # a new producer, at the restarted version and bound
    assert (rollouts.producer.base_version, rollouts.producer.max_staleness) == (5, 1)
    rollouts.stop()
