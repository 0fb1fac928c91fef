"""Latency quantiles in constant memory and the per-iteration snapshot window."""
from __future__ import annotations

import pytest

from miles.router.stats import LatencyWindow, RouterStats


def test_quantiles_are_within_the_bucket_width():
    window = LatencyWindow()
    for ms in range(1, 1001):  # 1..1000 ms: p50 = 500 ms, p99 = 990 ms
        window.observe(ms / 1000)
    assert window.quantile(0.5) == pytest.approx(0.5, rel=0.05)
    assert window.quantile(0.99) == pytest.approx(0.99, rel=0.05)
    assert window.quantile(0.5) >= 0.5  # upper bucket edge: never under-reports


def test_empty_window_has_no_quantile_and_extremes_are_clamped():
    window = LatencyWindow()
    assert window.quantile(0.5) is None
    window.observe(0.0)
    window.observe(1e9)
    assert window.quantile(0.01) == pytest.approx(1e-5)
    assert window.quantile(1.0) >= 3600


def test_snapshot_covers_the_window_since_the_previous_one():
    now = [100.0]
    stats = RouterStats(clock=lambda: now[0])
    stats.record(0.010, failed=False, retries=0)
    stats.record(0.020, failed=True, retries=2)
    stats.record_no_worker()
    now[0] = 102.0
    first = stats.snapshot(healthy=2, quarantined=1, inflight=0).as_metrics()
    assert first["router_requests"] == 3 and first["router_errors"] == 2
    assert first["router_retries"] == 2 and first["router_no_worker"] == 1
    assert first["router_requests_per_s"] == pytest.approx(1.5)
    assert first["router_healthy_workers"] == 2 and first["router_quarantined_workers"] == 1
    assert first["router_latency_p50_ms"] == pytest.approx(10, rel=0.05)
    second = stats.snapshot(healthy=2, quarantined=1, inflight=0).as_metrics()
    assert second["router_requests"] == 0 and "router_latency_p50_ms" not in second
    assert stats.total.requests == 3  # totals (Prometheus) are not reset


def test_peek_does_not_reset():
    stats = RouterStats()
    stats.record(0.001, failed=False, retries=0)
    assert stats.snapshot(1, 0, 0, reset=False).requests == 1
    assert stats.snapshot(1, 0, 0).requests == 1
