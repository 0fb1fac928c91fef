"""Helpers for tests that talk to a live embedded engine: its queue, and requests sent while it is paused."""
from __future__ import annotations

import httpx

from tests.support.wait import wait_for

# the limits of the engines' session engine (tests/engines/conftest.py)
MAX_BATCH = 16
MAX_QUEUED = 64


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
            wait_for(lambda: queued(control) >= want, 60, f"{want} queued requests", interval=0.02)
        finally:
            control.post("/continue_generation").raise_for_status()  # before the pool waits on them
        return [f.result() for f in futures]
