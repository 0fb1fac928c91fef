"""Shared fixtures of the engine tests: the tiny base checkpoint and one live engine on loopback."""
from __future__ import annotations

import time

import httpx
import pytest

from miles.config import EngineConfig
from miles.engines.launch import launch_engine

MAX_BATCH = 16
MAX_QUEUED = 64


@pytest.fixture(scope="session")
def engine_dir(tmp_path_factory):
    """The live engine's log and timeline file."""
    return tmp_path_factory.mktemp("engine")


@pytest.fixture(scope="session")
def engine(base_model, engine_dir):
    config = EngineConfig(engine_device="cpu", engine_max_batch_size=MAX_BATCH, engine_max_queued_requests=MAX_QUEUED)
    handle = launch_engine(base_model, config, log_path=engine_dir / "engine.log",
                           serve_args=["--timeline-path", str(engine_dir / "timeline.jsonl")])
    yield handle
    handle.stop()


@pytest.fixture()
def client(engine):
    with httpx.Client(base_url=engine.url, timeout=120.0) as c:
        yield c


def wait_for(predicate, what: str, timeout: float = 60.0):
    """Poll until predicate() is truthy (a readiness check with a deadline, not a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def queued(client: httpx.Client) -> int:
    return client.get("/get_server_info").json()["num_queue_reqs"]


def post_while_paused(url: str, path: str, bodies: list, expect_queued: int | None = None) -> list[httpx.Response]:
    """Pause the engine, send every body concurrently, wait until they all wait in the queue, then
    continue: the requests are decoded together (up to the max batch size), whatever the CPU load."""
    from concurrent.futures import ThreadPoolExecutor

    want = len(bodies) if expect_queued is None else expect_queued
    with httpx.Client(base_url=url, timeout=120.0) as control, ThreadPoolExecutor(len(bodies)) as pool:
        control.post("/pause_generation").raise_for_status()
        try:
            futures = [pool.submit(httpx.post, url + path, json=b, timeout=120.0) for b in bodies]
            wait_for(lambda: queued(control) >= want, f"{want} queued requests")
        finally:
            control.post("/continue_generation").raise_for_status()  # before the pool waits on them
        return [f.result() for f in futures]
