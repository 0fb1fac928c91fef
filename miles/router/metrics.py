"""Prometheus exposition of the router's state, read at scrape time (nothing is updated per request here)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from miles.router.stats import FixedHistogram, RouterStats
from miles.router.workers import LATENCY_BUCKETS, WorkerPool

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class RouterCollector:
    """A prometheus_client collector over one router's pool and stats."""

    def __init__(self, pool: WorkerPool, stats: RouterStats):
        self.pool = pool
        self.stats = stats

    def collect(self):
        workers = self.pool.workers
        requests = CounterMetricFamily("miles_router_worker_requests", "attempts sent to each worker", labels=["worker"])
        errors = CounterMetricFamily("miles_router_worker_errors", "failed attempts per worker (connection error, "
                                     "timeout, 5xx; never 4xx)", labels=["worker"])
        inflight = GaugeMetricFamily("miles_router_worker_inflight", "requests in flight per worker", labels=["worker"])
        healthy = GaugeMetricFamily("miles_router_worker_healthy", "1 if the worker takes traffic, 0 if quarantined",
                                    labels=["worker"])
        latency = HistogramMetricFamily("miles_router_worker_request_duration_seconds",
                                        "time of each attempt on a worker", labels=["worker"])
        for w in workers:
            requests.add_metric([w.url], w.requests)
            errors.add_metric([w.url], w.errors)
            inflight.add_metric([w.url], w.inflight)
            healthy.add_metric([w.url], 1 if w.serving else 0)
            cumulative, buckets = 0, []
            for bound, count in zip((*map(str, LATENCY_BUCKETS), "+Inf"), w.latency_counts):
                cumulative += count
                buckets.append((bound, cumulative))
            latency.add_metric([w.url], buckets, w.latency_sum)
        # the breaker per worker: closed (healthy, takes traffic), half_open (stale: registered, waits for the
        # current weights) or open (quarantined after failed checks); one-hot so a panel can stack them
        breaker = GaugeMetricFamily("miles_router_worker_breaker_state", "1 for the worker's current breaker "
                                    "state: closed (healthy), half_open (stale weights) or open (quarantined)",
                                    labels=["worker", "state"])
        failures = GaugeMetricFamily("miles_router_worker_consecutive_failures",
                                     "failed health checks or attempts in a row per worker", labels=["worker"])
        versions = GaugeMetricFamily("miles_router_worker_weight_version_info",
                                     "1, labelled with the weight version each worker last reported",
                                     labels=["worker", "weight_version"])
        for w in workers:
            for state, name in BREAKER_STATES.items():
                breaker.add_metric([w.url, name], 1 if w.state == state else 0)
            failures.add_metric([w.url], w.consecutive_failures)
            versions.add_metric([w.url, w.weight_version or ""], 1)
        total = self.stats.total
        yield CounterMetricFamily("miles_router_requests", "client requests handled", value=total.requests)
        yield CounterMetricFamily("miles_router_errors", "client requests that failed (5xx, 502, 503)",
                                  value=total.errors)
        yield CounterMetricFamily("miles_router_retries", "attempts retried on another worker", value=total.retries)
        yield CounterMetricFamily("miles_router_no_worker", "requests answered 503: no healthy worker",
                                  value=total.no_worker)
        yield GaugeMetricFamily("miles_router_inflight", "requests in flight", value=sum(w.inflight for w in workers))
        yield from (requests, errors, inflight, healthy, latency, breaker, failures, versions)
        yield _histogram("miles_router_request_duration_seconds", "client requests a worker answered (not the "
                         "no-worker 503s), from arrival to the last response byte, retries included", self.stats.request_seconds)
        yield _histogram("miles_router_time_to_first_chunk_seconds", "client requests until the first response "
                         "bytes (a stream's first tokens)", self.stats.first_chunk_seconds)
        version = GaugeMetricFamily("miles_router_weight_version_info", "1, labelled with the weight version the "
                                    "router was told serves", labels=["weight_version"])
        version.add_metric([self.pool.weight_version or ""], 1)
        yield version


BREAKER_STATES = {"healthy": "closed", "stale": "half_open", "quarantined": "open"}


def _histogram(name: str, text: str, hist: FixedHistogram) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, text)
    family.add_metric([], hist.cumulative(), hist.sum)
    return family


def render(pool: WorkerPool, stats: RouterStats) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RouterCollector(pool, stats))
    return generate_latest(registry)
