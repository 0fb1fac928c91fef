"""The shared Ray of the test processes (tests/support/ray_session.py): a module that leaves an actor alive on
it fails its tear-down naming the actor; actors killed as a run ends are given time to die, not reported."""
from __future__ import annotations

import pytest

from tests.support import ray_session

module_check = ray_session.module_scope  # ray_cluster's body: up, yield, the leak check


def start_actor():
    import ray

    @ray.remote(num_cpus=0)
    class Leaked:
        def ping(self) -> int:
            return 1

    actor = Leaked.remote()
    assert ray.get(actor.ping.remote()) == 1
    return actor


def test_an_actor_left_alive_fails_the_module_naming_it(ray_cluster, monkeypatch):
    monkeypatch.setattr(ray_session, "KILL_GRACE_S", 1.0)  # it is alive for good: no need to wait the whole grace
    check = module_check()
    next(check)
    leaked = start_actor()  # held: an actor whose last handle is dropped is ended by Ray
    named = r"actors left alive on the shared Ray by this module: \['[\w.<>]*Leaked'\]"  # its qualified name
    with pytest.raises(pytest.fail.Exception, match=named):
        next(check)
    assert not ray_session.ray_is_up()  # shut down with what it held; the next module that asks starts another
    del leaked


def test_an_actor_killed_at_the_end_is_not_a_leak(ray_cluster):
    import ray

    ray_session.up()  # the test before shut it down
    check = module_check()
    next(check)
    actor = start_actor()
    ray.kill(actor, no_restart=True)  # returns before the actor is dead, as at a run's end
    with pytest.raises(StopIteration):
        next(check)
    assert ray_session.ray_is_up()  # left up for the next module
