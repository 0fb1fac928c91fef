"""Faults under load: a worker killed mid-load, quarantined, kept out at stale weights, readmitted at current ones."""
from __future__ import annotations

import threading
import time
from collections import Counter

import httpx

from tests.support.wait import wait_for

INTERVAL, THRESHOLD, READMIT = 0.2, 3, 2
# Quarantine must come within INTERVAL x THRESHOLD of the kill; the slack absorbs a loaded 2-core box.
SLACK_S = 5.0


class Load:
    """`clients` threads posting /generate through the router until stopped; every status is kept."""

    def __init__(self, url: str, clients: int):
        self.url = url
        self.statuses: Counter = Counter()
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                try:
                    status = client.post(self.url + "/generate", json={"text": "1+1="}).status_code
                except httpx.HTTPError as exc:  # recorded, and the test fails on it
                    status = f"{type(exc).__name__}: {exc}"
                with self._lock:
                    self.statuses[status] += 1

    def __enter__(self) -> "Load":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def total(self) -> int:
        with self._lock:
            return sum(self.statuses.values())


def worker_state(handle, url: str) -> dict:
    workers = httpx.get(handle.url + "/workers").json()["workers"]
    return next(w for w in workers if w["url"] == url)


def test_killed_worker_is_failed_over_quarantined_and_readmitted_only_at_current_weights(stubs, router):
    engines = [stubs("--delay", "0.03", "--weight-version", "v1") for _ in range(3)]
    victim = engines[0]
    handle = router([e.url for e in engines], rollout_health_check_interval=INTERVAL,
                    rollout_health_check_timeout=2.0, miles_router_health_check_failure_threshold=THRESHOLD,
                    router_readmit_successes=READMIT, router_max_retries=3, router_retry_backoff=0.01)
    httpx.post(handle.url + "/update_weight_version", json={"weight_version": "v1"}).raise_for_status()

    with Load(handle.url, clients=9) as load:
        wait_for(lambda: worker_state(handle, victim.url)["requests"] >= 20, 60, "the victim to serve traffic")
        victim.kill()
        killed_at = time.monotonic()
        wait_for(lambda: worker_state(handle, victim.url)["state"] == "quarantined", INTERVAL * THRESHOLD + SLACK_S,
                 "the killed worker to be quarantined")
        quarantined_after = time.monotonic() - killed_at
        served = load.total()
        wait_for(lambda: load.total() >= served + 50, 60, "more load after the quarantine")
    assert set(load.statuses) == {200}, f"client requests failed: {load.statuses}"
    assert quarantined_after <= INTERVAL * THRESHOLD + SLACK_S
    stats = handle.stats()
    assert stats["router_errors"] == 0 and stats["router_retries"] > 0  # in-flight ones went elsewhere
    assert stats["router_quarantined_workers"] == 1 and stats["router_healthy_workers"] == 2

    # The trainer synced new weights while the victim was down; it comes back at the old ones: kept out.
    httpx.post(handle.url + "/update_weight_version", json={"weight_version": "v2"}).raise_for_status()
    stale = stubs("--weight-version", "v1", port=victim.port)
    wait_for(lambda: worker_state(handle, victim.url)["consecutive_successes"] >= READMIT + 3, 60,
             "several good health checks of the stale restart")
    state = worker_state(handle, victim.url)
    assert state["state"] == "quarantined" and state["weight_version"] == "v1"
    stale.kill()

    # Restarted at the current weights: readmitted, and it takes traffic again.
    stubs("--weight-version", "v2", port=victim.port)
    wait_for(lambda: worker_state(handle, victim.url)["state"] == "healthy", 60, "readmission at v2")
    before = worker_state(handle, victim.url)["requests"]
    for _ in range(9):  # least-inflight with sequential requests favours the first worker: the victim
        assert httpx.post(handle.url + "/generate", json={}).status_code == 200
    assert worker_state(handle, victim.url)["requests"] > before


def test_a_worker_failing_health_checks_leaves_and_returns(stubs, router):
    a, b = stubs(), stubs()
    handle = router([a.url, b.url], rollout_health_check_interval=0.05, miles_router_health_check_failure_threshold=2)
    httpx.post(a.url + "/stub/unhealthy").raise_for_status()
    wait_for(lambda: worker_state(handle, a.url)["state"] == "quarantined", 30, "quarantine of the unhealthy worker")
    for _ in range(10):
        r = httpx.post(handle.url + "/generate", json={})
        assert r.status_code == 200
    assert worker_state(handle, a.url)["requests"] == 0 and worker_state(handle, b.url)["requests"] == 10


def test_disabled_health_checks_never_quarantine(stubs, router):
    stub = stubs()
    handle = router([stub.url], disable_rollout_health_check=True, rollout_health_check_interval=0.05,
                    router_max_retries=0)
    stub.kill()
    for _ in range(5):
        assert httpx.post(handle.url + "/generate", json={}).status_code == 502
    assert handle.router.health.rounds == 0
    assert worker_state(handle, stub.url)["state"] == "healthy"
