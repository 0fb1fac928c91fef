"""A retried chunk whose ranks lost a peer starts new ranks: the survivors give up their names.

Named ranks outlive a failed task so that a retry attaches to them; when one of them is gone
(Ray's memory monitor killed it), the others are useless (their process group lost a member)
and, alive, they would hold the names the new group needs (Ray: ActorAlreadyExistsError).
"""
from __future__ import annotations

import pytest
import ray

from miles.backends.group import end_survivors
from miles.cluster.names import NAMESPACE, RunNames

pytestmark = pytest.mark.usefixtures("ray_cluster")


@ray.remote(num_cpus=0)
class Rank:
    def ping(self) -> str:
        return "pong"


def test_the_survivors_of_a_lost_group_free_their_names():
    names = RunNames("miles-test-survivors-0001")
    survivor = Rank.options(name=names.rank(0), namespace=NAMESPACE).remote()
    assert ray.get(survivor.ping.remote()) == "pong"  # rank 1 is gone: never started here

    assert end_survivors(names, 2) == [0]
    with pytest.raises(ValueError):
        ray.get_actor(names.rank(0), namespace=NAMESPACE)
    again = Rank.options(name=names.rank(0), namespace=NAMESPACE).remote()  # the retry's rank 0
    try:
        assert ray.get(again.ping.remote()) == "pong"
        assert end_survivors(RunNames("miles-test-survivors-none"), 2) == []
    finally:
        ray.kill(again)
