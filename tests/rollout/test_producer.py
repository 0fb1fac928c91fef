"""Admission control of async GRPO's rollout producer, against a fake engine and a fake trainer (in process,
no model): no token trains more than K weight versions stale, the producer does run K rollouts ahead, and
never further. The fake engine stamps every token with the version it serves when it samples it; one
request of each rollout straddles a weight push (it waits for the next push mid-generation), so samples
of mixed versions are part of what is checked.

Nothing depends on timing: the fake trainer waits (with a deadline) for states the bound allows, and
checks states the bound forbids while the producer is blocked on them.
"""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from miles.rollout.producer import ProducerStopped, RolloutProducer
from miles.rollout.sample import Sample
from miles.rollout.staleness import staleness_metrics

REQUESTS = 4
TOKENS = 3
DEADLINE_S = 30.0


class FakeEngine:
    """Serves a weight version; a rollout's requests await admission, then sample TOKENS tokens each."""

    def __init__(self, version: int, straddle: bool):
        self.version = version
        # the first request of a rollout admitted ahead of its training version waits for a push
        # mid-generation (one admitted at its own version would wait for its own training)
        self.straddle = straddle
        self.train_version = lambda rollout_id: 0
        self.pushed = threading.Condition()
        self.admitted: dict[int, list[int]] = {}  # rollout -> versions its requests started under
        self.lock = threading.Lock()

    def push(self, version: int) -> None:
        with self.pushed:
            self.version = version
            self.pushed.notify_all()

    def _wait_for_push(self, seen: int) -> None:
        with self.pushed:
            while self.version == seen:
                self.pushed.wait(timeout=0.1)

    def generate(self, rollout_id: int, prompts, admit) -> list[Sample]:
        async def one(i: int) -> Sample:
            await admit()
            # a request samples under the version it started with, except the straddler after its push:
            # reading self.version per token would let a push from the trainer thread land between two
            # tokens of any request (a preempted thread), a straddle the check below does not expect
            version = self.version
            with self.lock:
                self.admitted.setdefault(rollout_id, []).append(version)
            versions = []
            ahead = version < self.train_version(rollout_id)
            for t in range(TOKENS):
                if self.straddle and ahead and i == 0 and t == 1:
                    await asyncio.to_thread(self._wait_for_push, version)
                    version = self.version
                versions.append(str(version))
            return Sample(index=i, group_index=0, prompt=prompts, label=None, tokens=[1] * TOKENS,
                          response_length=TOKENS, weight_version=versions[0], token_weight_versions=versions,
                          raw_reward=1.0)

        async def rollout():
            return await asyncio.gather(*(one(i) for i in range(REQUESTS)))

        return asyncio.run(rollout())

    def started(self, rollout_id: int) -> int:
        with self.lock:
            return len(self.admitted.get(rollout_id, []))


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def run_fake_training(k: int, overlap: bool, rollouts: int = 6, first: int = 0, version: int = 0):
    """The fake trainer's loop; returns the staleness metrics of every rollout it trained."""
    # a straddler holds its whole rollout back: with one rollout at a time, the next could not start ahead
    engine = FakeEngine(version, straddle=overlap)
    # set before the producer starts: its thread admits the first rollouts at once
    engine.train_version = lambda rollout_id: version + rollout_id - first
    cursor = {"n": 0}

    def draw(j):
        cursor["n"] += 1
        return f"prompts of {j}", {"offset": cursor["n"]}

    producer = RolloutProducer(draw, engine.generate, first=first, version=version, max_staleness=k,
                               overlap=overlap)
    assert all(engine.train_version(j) == producer.train_version(j) for j in range(first, first + rollouts))
    seen = []
    try:
        for j in range(first, first + rollouts):
            taken = producer.take(j)
            assert taken.ready.cursor == {"offset": j - first + 1}  # the cursor after its own draw
            metrics = staleness_metrics(taken.ready.result, producer.train_version(j))
            assert metrics["rollout/staleness/max"] <= k, f"rollout {j}: {metrics}"
            assert min(engine.admitted[j]) >= producer.train_version(j) - k
            seen.append(metrics)
            # "training" rollout j: the bound lets requests of rollout j + K start now (their admission
            # version is this one), and forbids any of rollout j + K + 1 (it needs the push below)
            # (every rollout up to j + K: with --fully-async each has its own thread, in no set order)
            wait_until(lambda: all(engine.started(i) == REQUESTS for i in range(j, j + k + 1)),
                       f"rollouts {j + 1}..{j + k} to start while {j} trains")
            assert engine.started(j + k + 1) == 0, f"rollout {j + k + 1} started more than {k} versions ahead"
            engine.push(producer.train_version(j) + 1)
            producer.pushed(producer.train_version(j) + 1)
    finally:
        producer.close()
    return seen


@pytest.mark.parametrize("k,overlap", [(0, False), (0, True), (1, False), (2, False), (2, True)])
def test_no_token_is_more_than_k_versions_stale_and_the_producer_runs_k_ahead(k, overlap):
    seen = run_fake_training(k, overlap)
    if k == 0:  # the synchronous schedule: every token sampled by the weights it trains
        assert all(m["rollout/staleness/max"] == 0 and m["rollout/mixed_version_ratio"] == 0 for m in seen)
    else:
        assert max(m["rollout/staleness/max"] for m in seen) == k  # generated ahead, up to the bound
    if overlap and k >= 1:  # the straddling request of every rollout after the first spans a push
        assert all(m["rollout/mixed_version_ratio"] == 1 / REQUESTS for m in seen[1:])


def test_a_resumed_producer_counts_versions_from_where_it_starts():
    seen = run_fake_training(1, overlap=True, rollouts=3, first=5, version=5)
    assert max(m["rollout/staleness/max"] for m in seen) <= 1


def test_tightening_the_bound_holds_back_requests_not_yet_admitted():
    engine = FakeEngine(0, straddle=False)
    producer = RolloutProducer(lambda j: (j, {}), engine.generate, first=0, version=0, max_staleness=2,
                               overlap=False)
    try:
        producer.take(0)
        wait_until(lambda: engine.started(2) == REQUESTS, "rollout 2 to start at K = 2")
        producer.set_max_staleness(0)  # what --staleness-guard does
        engine.push(1)
        producer.pushed(1)
        producer.take(1)
        producer.take(2)
        assert engine.started(3) == 0  # K = 0 now: rollout 3 needs version 3
        for v in (2, 3):
            engine.push(v)
            producer.pushed(v)
        metrics = staleness_metrics(producer.take(3).ready.result, 3)
        assert metrics["rollout/staleness/max"] == 0
    finally:
        producer.close()


def test_a_failed_rollout_fails_the_take_and_close_stops_waiting_requests():
    def broken(rollout_id, prompts, admit):
        raise RuntimeError("engine on fire")

    producer = RolloutProducer(lambda j: (j, {}), broken, first=0, version=0, max_staleness=1, overlap=False)
    with pytest.raises(RuntimeError, match="engine on fire"):
        producer.take(0)
    producer.close()

    engine = FakeEngine(0, straddle=False)
    waiting = RolloutProducer(lambda j: (j, {}), engine.generate, first=0, version=0, max_staleness=0,
                              overlap=True)
    waiting.take(0)  # rollout 1 now waits for version 1, which never comes
    waiting.close()
    assert engine.started(1) == 0
    assert not waiting._thread.is_alive()
    with pytest.raises(ProducerStopped):
        waiting.clock.wait_for(99)
