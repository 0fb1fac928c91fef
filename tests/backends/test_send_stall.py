"""A source rank stopped (SIGSTOP) in its send to the engines fails the push instead of hanging it.

The send has no peer rank to fail it: the trainer's `call_bounded` reads the rank's own record
(`PushWatch.working`) and gives up on it once its heartbeat has been silent past the deadline.
"""
from __future__ import annotations

import os
import signal
import threading

import pytest
import ray

from miles.backends.group import ActorGroup, RankCallError
from miles.backends.push_deadline import PushWatch
from miles.run.collective_waits import DONE, FAILED, STALE_S, WORKING, gone, read_states
from miles.run.stragglers import RankCoords

pytestmark = pytest.mark.usefixtures("ray_cluster")
DEADLINE_S = 1.0


@ray.remote(num_cpus=0)
class Sender:
    """A rank's send: rank 1 stops itself inside it, as a SIGSTOPped source rank would."""

    def __init__(self, rank: int, run_dir: str):
        self.rank = rank
        self.watch = PushWatch(rank, 2, RankCoords(0, rank), DEADLINE_S, run_dir)

    def pid(self) -> int:
        return os.getpid()

    def send(self, version: int) -> int:
        with self.watch.working(version, "weight_send", "a test's send"):
            if self.rank == 1:
                os.kill(os.getpid(), signal.SIGSTOP)
            return self.rank


def _group(actors) -> ActorGroup:
    group = ActorGroup.__new__(ActorGroup)  # the ranks' calls, without starting training ranks
    group.actors = actors
    return group


def test_a_rank_stopped_in_its_send_fails_the_call_naming_it(tmp_path):
    actors = [Sender.remote(rank, str(tmp_path)) for rank in range(2)]
    pids = ray.get([a.pid.remote() for a in actors])
    outcome: dict = {}

    def call():
        try:
            outcome["result"] = _group(actors).call_bounded(
                "send", 7, grace_s=DEADLINE_S,
                gone=lambda rank: gone(tmp_path, rank, 7),
                hung=lambda rank: gone(tmp_path, rank, 7, stale_s=DEADLINE_S + STALE_S))
        except RankCallError as exc:
            outcome["error"] = exc

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(timeout=120)  # a guard against hanging the suite, not a measure
    try:
        assert not caller.is_alive(), "call_bounded still waits for the stopped rank"
        error = outcome["error"]
        assert error.silent == [1] and not error.errors
        assert "rank 1 did not answer" in str(error)
        states = read_states(tmp_path)
        assert states[0].state == DONE and states[1].state == WORKING
        assert states[1].phase == "weight_send" and states[1].version == 7
    finally:
        os.kill(pids[1], signal.SIGCONT)
        for actor in actors:
            ray.kill(actor)


def test_a_failed_send_is_recorded_and_raised_as_it_was(tmp_path):
    watch = PushWatch(0, 1, RankCoords(0, 0), DEADLINE_S, str(tmp_path))
    with pytest.raises(ConnectionError, match="engine went away"):
        with watch.working(3, "weight_send", "a test's send"):
            raise ConnectionError("engine went away")
    state = read_states(tmp_path)[0]
    assert state.state == FAILED and "engine went away" in state.error
