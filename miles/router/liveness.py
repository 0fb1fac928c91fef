"""The health loop: checks every worker each interval and lets the pool quarantine or readmit it.

A check is `GET /health` on the worker; a passing worker is then asked `GET /get_server_info`
for its `weight_version`, which readmission must match.
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

from miles.router.lane import RouterTimeline
from miles.serving.upstream import UpstreamError, UpstreamPool
from miles.router.workers import Worker, WorkerPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Probe:
    """One worker's answer to a health check."""

    ok: bool
    weight_version: str | None = None


class HealthChecker:
    """Runs the checks; `check_all` is one round, `run` loops until cancelled."""

    def __init__(self, pool: WorkerPool, upstream: UpstreamPool, interval: float, timeout: float,
                 timeline: RouterTimeline | None = None):
        self.pool = pool
        self.timeline = timeline
        self.upstream = upstream
        self.interval = interval
        self.timeout = timeout
        self.rounds = 0

    async def probe(self, worker: Worker) -> Probe:
        """Check one worker; a worker's failure is a failed probe, never an exception."""
        try:
            health = await self.upstream.fetch(worker.endpoint, "GET", "/health", self.timeout)
            if health.status != 200:
                return Probe(False)
            info = await self.upstream.fetch(worker.endpoint, "GET", "/get_server_info", self.timeout)
        except (UpstreamError, OSError, asyncio.TimeoutError):
            return Probe(False)
        return Probe(True, _weight_version(info.body) if info.status == 200 else None)

    async def check(self, worker: Worker) -> None:
        probe = await self.probe(worker)
        if self.pool.get(worker.url) is not worker:
            return  # removed while the check ran
        verdict = self.pool.record_check(worker, probe.ok, probe.weight_version)
        if verdict.quarantined:
            self.upstream.forget(worker.endpoint)
            log.warning("router: quarantined %s after %d failed health checks", worker.url,
                        worker.consecutive_failures)
            if self.timeline is not None:
                self.timeline.event("quarantine", url=worker.url)
        elif verdict.admitted:
            log.warning("router: admitted stale %s at weight version %s", worker.url, worker.weight_version)
            if self.timeline is not None:
                self.timeline.event("admit", url=worker.url, weight_version=worker.weight_version)
        elif verdict.readmitted:
            log.warning("router: readmitted %s at weight version %s", worker.url, worker.weight_version)
            if self.timeline is not None:
                self.timeline.event("readmit", url=worker.url, weight_version=worker.weight_version)

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(w) for w in self.pool.workers))
        self.rounds += 1

    async def run(self) -> None:
        while True:
            try:
                await self.check_all()
            except asyncio.CancelledError:
                raise
            except Exception:  # a background loop must outlive any one bad round
                log.exception("router: health check round failed")
            await asyncio.sleep(self.interval)


def _weight_version(body: bytes) -> str | None:
    try:
        info = json.loads(body)
    except ValueError:
        return None
    version = info.get("weight_version") if isinstance(info, dict) else None
    return None if version is None else str(version)
