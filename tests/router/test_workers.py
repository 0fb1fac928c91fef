"""Worker pool rules without HTTP: policies, quarantine, versioned readmission, bad URLs."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from miles.router.workers import WorkerError, WorkerPool


def pool_of(n: int, policy: str = "least-inflight", **kwargs) -> WorkerPool:
    pool = WorkerPool(policy, rng=random.Random(0), **kwargs)
    for i in range(n):
        pool.add(f"http://127.0.0.1:{9000 + i}")
    return pool


def test_least_inflight_picks_the_least_busy_worker():
    pool = pool_of(3)
    a, b, c = pool.workers
    a.inflight, b.inflight, c.inflight = 4, 1, 2
    assert pool.choose() is b
    b.inflight = 5
    assert pool.choose() is c


def test_round_robin_cycles_through_every_healthy_worker():
    pool = pool_of(3, "round-robin")
    picks = Counter(pool.choose().url for _ in range(30))
    assert sorted(picks.values()) == [10, 10, 10]


def test_power_of_two_never_picks_the_busiest_of_three():
    # Any two sampled workers include one less busy than the busiest, so it never wins.
    pool = pool_of(3, "power-of-two")
    busy = pool.workers[0]
    busy.inflight = 100
    picks = {pool.choose().url for _ in range(200)}
    assert busy.url not in picks and len(picks) == 2


def test_choose_avoids_excluded_workers_unless_none_is_left():
    pool = pool_of(2)
    a, b = pool.workers
    assert pool.choose(exclude=[a]) is b
    assert pool.choose(exclude=[a, b]) in (a, b)  # all tried: retry among the healthy ones


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="fastest"):
        WorkerPool("fastest")


@pytest.mark.parametrize("url, message", [
    ("", "non-empty"), ("ftp://x:1", "not an http"), ("localhost:8000", "not an http"),
    ("https://x:1", "plain http"), (None, "non-empty"),
])
def test_bad_worker_urls_are_refused_with_the_url_named(url, message):
    with pytest.raises(WorkerError, match=message):
        WorkerPool().add(url)


def test_duplicates_and_unknown_removals_are_refused():
    pool = pool_of(1)
    with pytest.raises(WorkerError, match="already registered"):
        pool.add("http://127.0.0.1:9000/")  # trailing slash: the same worker
    with pytest.raises(WorkerError, match="not registered"):
        pool.remove("http://127.0.0.1:9999")
    pool.remove("http://127.0.0.1:9000")
    assert pool.urls == [] and pool.choose() is None


def test_quarantine_after_threshold_failures_in_a_row():
    pool = pool_of(2, failure_threshold=3)
    w = pool.workers[0]
    pool.record_check(w, False)
    pool.record_check(w, True)   # a success resets the count
    assert not pool.record_check(w, False).quarantined
    assert not pool.record_check(w, False).quarantined
    assert pool.record_check(w, False).quarantined
    assert not w.healthy and pool.healthy == [pool.workers[1]]


def test_readmission_needs_successes_and_the_current_weight_version():
    pool = pool_of(1, failure_threshold=1, readmit_successes=2)
    w = pool.workers[0]
    pool.set_weight_version("v2")
    pool.record_check(w, False)
    assert pool.choose() is None
    for _ in range(5):  # healthy but serving old weights: stays out
        assert not pool.record_check(w, True, weight_version="v1").readmitted
    assert not w.healthy
    assert not pool.record_check(w, False).readmitted  # restart resets the streak
    assert not pool.record_check(w, True, weight_version="v2").readmitted  # 1 of 2 successes
    assert pool.record_check(w, True, weight_version="v2").readmitted
    assert pool.choose() is w


def test_readmission_without_a_known_version_needs_only_successes():
    pool = pool_of(1, failure_threshold=1, readmit_successes=1)
    w = pool.workers[0]
    pool.record_check(w, False)
    assert pool.record_check(w, True, weight_version="anything").readmitted


def test_a_routing_key_sticks_to_one_worker_and_falls_back_to_the_same_next_one():
    pool = WorkerPool("least-inflight")
    workers = [pool.add(f"http://127.0.0.1:{9000 + i}") for i in range(4)]
    keys = [f"trajectory-{i}".encode() for i in range(40)]
    first = {key: pool.choose(routing_key=key) for key in keys}
    workers[0].inflight = workers[1].inflight = 50  # load does not move a keyed request
    assert all(pool.choose(routing_key=key) is first[key] for key in keys)
    assert len(set(first.values())) > 1  # keys spread over the workers

    key = keys[0]
    pinned = first[key]
    fallback = pool.choose([pinned], routing_key=key)  # the pinned worker failed this request
    assert fallback is not pinned
    for _ in range(pool.failure_threshold):
        pool.record_check(pinned, ok=False)  # ... and is then quarantined
    assert pool.choose(routing_key=key) is fallback  # every later turn goes to the same fallback


def test_a_stale_worker_is_never_chosen_and_admitted_only_at_the_current_version():
    pool = pool_of(2)
    a, b = pool.workers
    pool.set_weight_version("7")
    pool.mark_stale(a.url)
    assert a.state == "stale" and [pool.choose() for _ in range(5)] == [b] * 5
    with pytest.raises(WorkerError, match="serves 7"):
        pool.admit(a.url, "6")
    assert a.state == "stale"
    pool.admit(a.url, "7")
    assert a.state == "healthy" and a in pool.healthy


def test_health_checks_admit_a_stale_worker_only_once_it_reports_the_current_weights():
    pool = WorkerPool(readmit_successes=2)
    worker = pool.add("http://127.0.0.1:9000", stale=True, weight_version="0")
    for _ in range(3):  # no version known yet: only an explicit admit lets it in
        assert not pool.record_check(worker, True, "0").admitted
    pool.set_weight_version("3")
    for _ in range(3):
        assert not pool.record_check(worker, True, "2").admitted
    assert pool.healthy == []
    assert pool.record_check(worker, True, "3").admitted and pool.healthy == [worker]
