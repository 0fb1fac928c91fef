"""The router's lane of a run's timeline: bursts of proxied requests and the admin events, held in memory and
appended to the timeline file by a timer, so no request ever waits on a file write.

A burst is a stretch of proxied requests with no idle gap of IDLE_GAP_S between them (a rollout's
requests arrive together and keep the router busy until the last answer); it becomes one `proxy`
span whose args are the router's counters over it: requests, errors, retries, no-worker answers.
Events are spans of their own: `add_worker`, `remove_worker`, `update_weight_version`, `quarantine`,
`readmit`, and each engine admin request sent through the router (e.g. `update_weights_from_disk`,
`pause_generation`), named by its path and as long as it took.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from miles.serving import auth
from miles.router.stats import Counters, RouterStats
from miles.record.timeline import Span, TimelineWriter

log = logging.getLogger(__name__)

LANE = "router"
IDLE_GAP_S = 0.05  # nothing in flight this long ends a burst (as the engines' decode stretches)
MAX_BURST_S = 10.0  # steady traffic is cut into spans this long, so a live dashboard sees it
FLUSH_S = 0.25  # how often the buffered spans are written

Asgi = Callable[[Any, Any, Any], Awaitable[None]]


class RouterTimeline:
    """Collects the router's spans; `RouterTimeline(TimelineWriter(None), stats)` collects nothing."""

    def __init__(self, writer: TimelineWriter, stats: RouterStats, clock: Callable[[], float] = time.time):
        self.writer, self.stats, self.clock = writer, stats, clock
        self.enabled = writer.path is not None
        self.inflight = 0
        self.last_end = 0.0  # when the latest proxied request ended
        self._burst_start: float | None = None
        self._burst_counts = Counters()  # the router's totals when the burst began
        self._pending: list[Span] = []

    # ---- the hot path: counters only --------------------------------------------------------------
    def wrap(self, proxy: Asgi) -> Asgi:
        """`proxy` with every request counted into the current burst (engine admin requests also as spans)."""
        async def timed_proxy(scope, receive, send) -> None:
            start = self.clock()
            if not self.inflight:
                if self._burst_start is not None and start - self.last_end >= IDLE_GAP_S:
                    self._close(self.last_end)  # idle since: the timer has not ended that burst yet
                if self._burst_start is None:
                    self._open(start)
            self.inflight += 1
            try:
                await proxy(scope, receive, send)
            finally:
                self.inflight -= 1
                self.last_end = self.clock()
                if not auth.is_open_engine_path(scope["path"]):  # a state change of an engine: rare
                    self.event(scope["path"].lstrip("/"), start, self.last_end)
        return timed_proxy

    def event(self, name: str, start: float | None = None, end: float | None = None, **args: Any) -> None:
        """An admin event as a span (instant unless `end` is given)."""
        if self.enabled:
            start = self.clock() if start is None else start
            self._pending.append(Span(LANE, name, start, start if end is None else end, None, args))

    # ---- the timer ---------------------------------------------------------------------------------
    async def run(self) -> None:
        """Close idle bursts and write what is buffered, every FLUSH_S, until cancelled."""
        while True:
            await asyncio.sleep(FLUSH_S)
            try:
                self.tick()
            except Exception:  # a background loop must outlive a full disk; the spans are dropped
                log.exception("router: writing the timeline failed")
                self._pending.clear()

    def tick(self) -> None:
        """End the burst when it idled IDLE_GAP_S (at its last answer) or ran MAX_BURST_S; write the spans."""
        now = self.clock()
        if self._burst_start is not None:
            if not self.inflight and now - self.last_end >= IDLE_GAP_S:
                self._close(self.last_end)
            elif now - self._burst_start >= MAX_BURST_S:
                self._close(now if self.inflight else self.last_end)
                if self.inflight:
                    self._open(now)
        self.flush()

    def flush(self) -> None:
        spans, self._pending = self._pending, []
        for span in spans:
            self.writer.write(span)

    def close(self) -> None:
        """At shutdown: the open burst ends now (or at its last answer) and everything is written."""
        if self._burst_start is not None:
            self._close(self.clock() if self.inflight else self.last_end)
        self.flush()
        self.writer.close()

    def _open(self, start: float) -> None:
        self._burst_start = start
        self._burst_counts = dataclasses.replace(self.stats.total)

    def _close(self, end: float) -> None:
        start, before, now = self._burst_start, self._burst_counts, self.stats.total
        self._burst_start = None
        self._pending.append(Span(LANE, "proxy", start, max(end, start), None, {
            "requests": now.requests - before.requests, "errors": now.errors - before.errors,
            "retries": now.retries - before.retries, "no_worker": now.no_worker - before.no_worker}))
