"""Router-wide counters: totals for Prometheus and a window the trainer snapshots once per iteration.

Latencies go into a fixed log-bucketed histogram (about 4% wide buckets), so memory stays
constant however many requests pass between snapshots and p50/p99 cost nothing to keep.
"""
from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field

_MIN_S = 1e-5       # 10 us: the first bucket
_GROWTH = 1.04      # bucket width ratio: quantiles are within ~4%
_LOG_GROWTH = math.log(_GROWTH)
_BUCKETS = int(math.log(3600.0 / _MIN_S) / _LOG_GROWTH) + 2


class LatencyWindow:
    """Quantiles of the latencies observed since the last reset, in constant memory."""

    def __init__(self):
        self.counts = [0] * _BUCKETS
        self.total = 0

    def observe(self, seconds: float) -> None:
        index = 0 if seconds <= _MIN_S else min(int(math.log(seconds / _MIN_S) / _LOG_GROWTH) + 1, _BUCKETS - 1)
        self.counts[index] += 1
        self.total += 1

    def quantile(self, q: float) -> float | None:
        """The q-quantile in seconds (the upper edge of its bucket), or None when nothing was observed."""
        if not self.total:
            return None
        rank = max(1, math.ceil(q * self.total))
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return _MIN_S * _GROWTH ** index
        raise AssertionError("rank beyond the observed total")

    def reset(self) -> None:
        self.counts = [0] * _BUCKETS
        self.total = 0


# Prometheus buckets (seconds) of the client-side histograms: whole requests and their first response chunk.
REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass
class FixedHistogram:
    """Cumulative counts over fixed bounds since start: what /metrics exposes (two list adds per observation)."""

    bounds: tuple[float, ...] = REQUEST_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(REQUEST_BUCKETS) + 1))
    sum: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, count) pairs as prometheus_client's HistogramMetricFamily takes them, +Inf last."""
        total, out = 0, []
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts):
            total += count
            out.append((bound, total))
        return out


@dataclass
class Counters:
    requests: int = 0
    errors: int = 0
    retries: int = 0
    no_worker: int = 0


@dataclass(frozen=True)
class StatsSnapshot:
    """Figures since the previous snapshot; `as_metrics()` gives the trainer's `router_*` keys."""

    window_seconds: float
    requests: int
    errors: int
    retries: int
    no_worker: int
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    healthy_workers: int
    quarantined_workers: int
    inflight: int

    def as_metrics(self) -> dict[str, float]:
        """Flat numbers for `rollout/router_*` (latency keys only when requests were seen)."""
        out = {
            "router_requests": self.requests,
            "router_errors": self.errors,
            "router_retries": self.retries,
            "router_no_worker": self.no_worker,
            "router_requests_per_s": self.requests / self.window_seconds if self.window_seconds > 0 else 0.0,
            "router_healthy_workers": self.healthy_workers,
            "router_quarantined_workers": self.quarantined_workers,
            "router_inflight": self.inflight,
        }
        if self.latency_p50_ms is not None:
            out["router_latency_p50_ms"] = self.latency_p50_ms
            out["router_latency_p99_ms"] = self.latency_p99_ms
        return out


class RouterStats:
    """Totals since start plus the window since the last snapshot."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.total = Counters()
        self.window = Counters()
        self.latency = LatencyWindow()
        self.window_start = clock()
        self.request_seconds = FixedHistogram()  # every answered client request, retries included
        self.first_chunk_seconds = FixedHistogram()  # until the first response bytes went to the client

    def record(self, seconds: float, failed: bool, retries: int) -> None:
        for counters in (self.total, self.window):
            counters.requests += 1
            counters.retries += retries
            if failed:
                counters.errors += 1
        self.latency.observe(seconds)
        self.request_seconds.observe(seconds)

    def record_first_chunk(self, seconds: float) -> None:
        self.first_chunk_seconds.observe(seconds)

    def record_no_worker(self) -> None:
        for counters in (self.total, self.window):
            counters.requests += 1
            counters.errors += 1
            counters.no_worker += 1

    def snapshot(self, healthy: int, quarantined: int, inflight: int, reset: bool = True) -> StatsSnapshot:
        now = self.clock()
        w = self.window
        snap = StatsSnapshot(
            window_seconds=now - self.window_start, requests=w.requests, errors=w.errors, retries=w.retries,
            no_worker=w.no_worker,
            latency_p50_ms=_ms(self.latency.quantile(0.5)), latency_p99_ms=_ms(self.latency.quantile(0.99)),
            healthy_workers=healthy, quarantined_workers=quarantined, inflight=inflight)
        if reset:
            self.window = Counters()
            self.latency.reset()
            self.window_start = now
        return snap


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)
