"""Router test fixtures: stub engines as real processes on loopback, routers started in-process."""
from __future__ import annotations

import pytest

from tests.support.routers import router_factory

from .stubs import Stub, launch_stub


@pytest.fixture
def stubs():
    """`stubs(*args, port=0)` starts a stub engine process; every one is killed at teardown."""
    started: list[Stub] = []

    def start(*args: str, port: int = 0) -> Stub:
        stub = launch_stub(*args, port=port)
        started.append(stub)
        return stub
    yield start
    for stub in started:
        stub.kill()


@pytest.fixture
def router():
    """`router(worker_urls, timeline_path=None, **config)` starts an in-process router; all are stopped at teardown."""
    with router_factory() as start:
        yield start
