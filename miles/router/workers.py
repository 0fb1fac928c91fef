"""The router's workers: their state, quarantine and readmission rules, and the choice of one per request.

Pure bookkeeping with no I/O, so every rule is testable without a server: the health loop
and the proxy report what they saw and ask this module what to do.
"""
from __future__ import annotations

import bisect
import hashlib
import random
import re
from dataclasses import dataclass, field
from typing import Iterable
from urllib.parse import urlsplit

from miles.serving.upstream import Endpoint

POLICIES = ("least-inflight", "round-robin", "power-of-two")
# Prometheus buckets for the per-worker request duration (seconds).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


# What an http://host:port URL is made of (an IPv6 literal with its zone, the characters of a path, query
# or fragment so that those get their own message below). Anything else (a NUL, a space, a newline, a
# quote, non-ASCII) names no worker and, stored, would be written into the router's log lines as is.
URL_CHARS = re.compile(r"[A-Za-z0-9\-._~:/\[\]@%?#&=+]*")


class WorkerError(ValueError):
    """A bad worker URL, a duplicate, or an unknown worker; the message names it."""


def check_worker_url(url: object) -> str:
    if not isinstance(url, str) or not url:
        raise WorkerError(f"worker url must be a non-empty string, got {url!r}")
    odd = next((c for c in url if not URL_CHARS.fullmatch(c)), None)
    if odd is not None:
        raise WorkerError(f"worker url {url!r:.200} holds {odd!r}, which no http://host:port URL has")
    if not url.startswith(("http://", "https://")):
        raise WorkerError(f"worker url {url!r} is not an http(s) URL")
    if url.startswith("https://"):
        raise WorkerError(f"worker url {url!r}: the router talks plain http to engines")
    try:
        parts = urlsplit(url)
        port = parts.port
        Endpoint.from_url(url)
    except ValueError as exc:
        raise WorkerError(f"worker url {url!r}: {exc}") from None
    if parts.username is not None or parts.password is not None:
        # never stored: /list_workers, /workers and /metrics would show them to anyone
        raise WorkerError("worker url must not carry credentials (user:password@); the router does not send them")
    if port == 0:
        raise WorkerError(f"worker url {url!r}: port 0 is not a port a worker can listen on")
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise WorkerError(f"worker url {url!r}: give only http://host:port (a path, query or fragment is not used)")
    return url.rstrip("/")


@dataclass(eq=False)
class Worker:
    """One engine behind the router and what the router knows about it."""

    url: str
    endpoint: Endpoint
    healthy: bool = True
    # stale: registered (e.g. a relaunched engine) but not yet serving the current weights: no traffic until
    # it is admitted at the current weight version (weight-gated readmission)
    stale: bool = False
    inflight: int = 0
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    weight_version: str | None = None
    requests: int = 0
    errors: int = 0
    latency_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    latency_sum: float = 0.0

    @property
    def state(self) -> str:
        """healthy (takes traffic), stale (waits for the current weights) or quarantined (failed its checks)."""
        if self.stale:
            return "stale"
        return "healthy" if self.healthy else "quarantined"

    @property
    def serving(self) -> bool:
        return self.healthy and not self.stale

    def observe(self, seconds: float, failed: bool) -> None:
        self.requests += 1
        if failed:
            self.errors += 1
        self.latency_counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.latency_sum += seconds

    def describe(self) -> dict:
        return {"url": self.url, "state": self.state, "inflight": self.inflight,
                "consecutive_failures": self.consecutive_failures,
                "consecutive_successes": self.consecutive_successes, "weight_version": self.weight_version,
                "requests": self.requests, "errors": self.errors}


@dataclass(frozen=True)
class HealthVerdict:
    """What one health check changed for a worker."""

    quarantined: bool = False
    readmitted: bool = False
    admitted: bool = False  # a stale worker reached the current weight version


class WorkerPool:
    """Registered workers, the current weight version, and the selection policy."""

    def __init__(self, policy: str = "least-inflight", failure_threshold: int = 3, readmit_successes: int = 2,
                 rng: random.Random | None = None):
        if policy not in POLICIES:
            raise ValueError(f"unknown router policy {policy!r}; choose one of: {', '.join(POLICIES)}")
        self.policy = policy
        self.failure_threshold = failure_threshold
        self.readmit_successes = readmit_successes
        self.weight_version: str | None = None
        self.rng = rng or random.Random()
        self._workers: dict[str, Worker] = {}
        self._healthy: list[Worker] = []  # cached: the hot path reads it on every request
        self._rr = 0

    # registry
    def add(self, url: str, stale: bool = False, weight_version: str | None = None) -> Worker:
        url = check_worker_url(url)
        if url in self._workers:
            raise WorkerError(f"worker {url} is already registered")
        worker = Worker(url, Endpoint.from_url(url), stale=stale,
                        weight_version=None if weight_version is None else str(weight_version))
        self._workers[url] = worker
        self._refresh()
        return worker

    def remove(self, url: str) -> Worker:
        key = url.rstrip("/") if isinstance(url, str) else url
        worker = self._workers.pop(key, None)
        if worker is None:
            raise WorkerError(f"worker {url!r} is not registered")
        self._refresh()
        return worker

    def get(self, url: str) -> Worker | None:
        return self._workers.get(url)

    @property
    def workers(self) -> list[Worker]:
        return list(self._workers.values())

    @property
    def urls(self) -> list[str]:
        return list(self._workers)

    @property
    def healthy(self) -> list[Worker]:
        return self._healthy

    def _refresh(self) -> None:
        self._healthy = [w for w in self._workers.values() if w.serving]

    def mark_stale(self, url: str) -> Worker:
        """Take a worker out of traffic until it is admitted again (its engine died or is being relaunched)."""
        worker = self._known(url)
        worker.stale = True
        self._refresh()
        return worker

    def admit(self, url: str, weight_version: str) -> Worker:
        """Let a stale worker take traffic again, only at the router's current weight version (when one is
        set): a worker still serving older weights would mix policies within a rollout."""
        worker = self._known(url)
        version = str(weight_version)
        if self.weight_version is not None and version != self.weight_version:
            raise WorkerError(f"worker {worker.url} is at weight version {version}; the router serves "
                              f"{self.weight_version}, so it stays stale")
        worker.weight_version = version
        worker.stale = False
        worker.healthy = True
        worker.consecutive_failures = 0
        self._refresh()
        return worker

    def _known(self, url: str) -> Worker:
        key = url.rstrip("/") if isinstance(url, str) else url
        worker = self._workers.get(key)
        if worker is None:
            raise WorkerError(f"worker {url!r} is not registered")
        return worker

    # selection
    def choose(self, exclude: Iterable[Worker] = (), routing_key: bytes | None = None) -> Worker | None:
        """A healthy worker by the policy, avoiding `exclude` when another is available; None if none is healthy.
        With a routing key, the key's own worker (rendezvous hashing: every request of a key goes to the
        same worker while it is healthy, and to the same next one when it is not)."""
        candidates = self._healthy
        if exclude:
            others = [w for w in candidates if w not in exclude]
            candidates = others or candidates
        if not candidates:
            return None
        if len(candidates) == 1:
            return candidates[0]
        if routing_key:
            return max(candidates, key=lambda w: _affinity(routing_key, w))
        if self.policy == "least-inflight":
            return min(candidates, key=_inflight)
        if self.policy == "round-robin":
            self._rr += 1
            return candidates[self._rr % len(candidates)]
        a, b = self.rng.sample(candidates, 2)
        return a if a.inflight <= b.inflight else b

    # health
    def set_weight_version(self, version: str) -> None:
        self.weight_version = str(version)

    def record_check(self, worker: Worker, ok: bool, weight_version: str | None = None) -> HealthVerdict:
        """Apply one health check result: quarantine after `failure_threshold` failures in a row; readmit after
        `readmit_successes` good checks in a row, and only at the current weight version (when one is known)."""
        if weight_version is not None:
            worker.weight_version = str(weight_version)
        if not ok:
            worker.consecutive_successes = 0
            worker.consecutive_failures += 1
            if worker.healthy and worker.consecutive_failures >= self.failure_threshold:
                worker.healthy = False
                self._refresh()
                return HealthVerdict(quarantined=True)
            return HealthVerdict()
        worker.consecutive_failures = 0
        worker.consecutive_successes += 1
        if worker.stale:
            # the health loop admits a stale worker itself once it reports the current weights (a supervisor
            # usually admits it sooner); with no version known yet only an explicit admit does
            if (self.weight_version is not None and worker.weight_version == self.weight_version
                    and worker.consecutive_successes >= self.readmit_successes):
                worker.stale, worker.healthy = False, True
                self._refresh()
                return HealthVerdict(admitted=True)
            return HealthVerdict()
        if worker.healthy:
            return HealthVerdict()
        current = self.weight_version is None or worker.weight_version == self.weight_version
        if current and worker.consecutive_successes >= self.readmit_successes:
            worker.healthy = True
            self._refresh()
            return HealthVerdict(readmitted=True)
        return HealthVerdict()


def _affinity(routing_key: bytes, worker: Worker) -> bytes:
    return hashlib.blake2b(routing_key + b"|" + worker.url.encode(), digest_size=8).digest()


def _inflight(worker: Worker) -> int:
    return worker.inflight
