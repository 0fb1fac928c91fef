"""One local Ray per test process, kept up between the modules that ask for it (`ray_cluster`).

A run in this process (`train()`) joins a Ray that is already up and leaves it up, as on a cluster given with
--ray-address; with none up it starts its own and shuts it down. Measured on this 2-core machine, a tiny plain
run took 10.1 s and 13.7 CPU-s with its own Ray, 6.3 s and 10.0 CPU-s joining one (starting a local Ray costs
2.5 s and 3.6 CPU-s; its shutdown about 1.3 s more). So every module whose tests use `ray_cluster` shares one
Ray per pytest process, started by the first of them; every other test starts as before, with no Ray up in
this process (a flow in this process starts its own, with its workers' runtime env).

What a module left running on the shared Ray is a leak a user joining a cluster would see too: at the module's
end `ray_cluster` fails naming the actors alive that were not alive at its start, and shuts that Ray down."""
from __future__ import annotations

import sys
import time

import pytest

# ray.kill returns before the actor is dead: the actors a run killed as it ended may still show alive for a moment
KILL_GRACE_S = 10.0
LIVE_STATES = frozenset({"DEPENDENCIES_UNREADY", "PENDING_CREATION", "ALIVE", "RESTARTING"})
RAY_MODULES = pytest.StashKey[frozenset]()  # modules with a test that uses ray_cluster


def ray_is_up() -> bool:
    return "ray" in sys.modules and sys.modules["ray"].is_initialized()


def up() -> None:
    """The shared local Ray, started the way a run starts its own (miles.cluster.connect: token auth, namespace,
    no secret-named variable in its processes' environment, all CPUs)."""
    if not ray_is_up():
        from miles.cluster.connect import connect

        connect(None)


def down() -> None:
    if ray_is_up():
        sys.modules["ray"].shutdown()


def live_actors() -> dict[str, str]:
    """Actor id -> class name of the actors alive on the shared Ray."""
    from ray._private import state

    return {actor_id: info.get("ActorClassName") or "?"
            for actor_id, info in state.actors().items() if info["State"] in LIVE_STATES}


def pytest_collection_modifyitems(session, config, items):
    config.stash[RAY_MODULES] = frozenset(item.module.__name__ for item in items
                                          if getattr(item, "module", None) is not None
                                          and "ray_cluster" in getattr(item, "fixturenames", ()))


def module_scope():
    """The body of `ray_cluster`: the shared Ray up for the module; what the module left alive on it fails the
    module's tear-down (and that Ray is shut down with it)."""
    up()
    before = set(live_actors())
    yield
    if not ray_is_up():
        return
    left = left_alive(before)
    if left:
        down()  # ends them all; the next module that asks starts a fresh one
        pytest.fail(f"actors left alive on the shared Ray by this module: {left}")


@pytest.fixture(scope="module")
def ray_cluster():
    """The shared Ray, up for the module; what the module left alive on it fails the module's tear-down."""
    yield from module_scope()


def left_alive(before: set[str]) -> list[str]:
    """The class names of the actors alive now that were not in `before`, once those being killed had
    KILL_GRACE_S to die."""
    deadline = time.monotonic() + KILL_GRACE_S
    while True:
        left = sorted(name for actor_id, name in live_actors().items() if actor_id not in before)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


@pytest.fixture(autouse=True)
def ray_scope(request):
    """Tests of a module that uses the shared Ray run with it up; every other test with no Ray up in this process."""
    module = getattr(request.node, "module", None)
    if module is not None and module.__name__ in request.config.stash.get(RAY_MODULES, frozenset()):
        up()
    else:
        down()
    yield
