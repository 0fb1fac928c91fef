"""The router passes SGLang's /pause_generation and /continue_generation to every worker (a weight update
pauses the whole fleet), with the mode in the body; a worker that does not take it is named in a 502."""
from __future__ import annotations

import httpx


def paused(stub) -> str | None:
    return httpx.get(f"{stub.url}/stub/stats", timeout=10).json()["paused"]


def test_pause_and_continue_reach_every_worker(stubs, router):
    a, b = stubs(), stubs()
    handle = router([a.url, b.url])
    answer = httpx.post(f"{handle.url}/pause_generation", json={"mode": "in_place"}, timeout=30)
    assert answer.status_code == 200 and answer.json()["success"]
    assert sorted(answer.json()["workers"]) == sorted([a.url, b.url])
    assert paused(a) == paused(b) == "in_place"
    assert httpx.post(f"{handle.url}/continue_generation", json={}, timeout=30).status_code == 200
    assert paused(a) is None and paused(b) is None


def test_a_worker_that_cannot_be_reached_is_named(stubs, router):
    a, b = stubs(), stubs()
    handle = router([a.url, b.url], disable_rollout_health_check=True)
    b.kill()
    answer = httpx.post(f"{handle.url}/pause_generation", json={"mode": "retract"}, timeout=30)
    assert answer.status_code == 502 and list(answer.json()["failed"]) == [b.url]
    assert paused(a) == "retract"
