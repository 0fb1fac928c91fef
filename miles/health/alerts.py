"""Red flags as tracker alerts: which signals a journal line flags, the alert's words, and a rate limit.

The trackers see the health watch only through the `health/<signal>` keys of the journal
lines they deliver, so an alert needs nothing the line does not carry.
"""
from __future__ import annotations

import time
from typing import Callable

from miles.health.signals import PREFIX, SIGNALS, metric_name

TITLE_LIMIT = 63  # wandb: a title must be under 64 characters


def red_flags_in(metrics: dict[str, float]) -> list[str]:
    """Signals whose `health/<signal>` is 1 in this line."""
    return [k[len(PREFIX):] for k, v in metrics.items() if k.startswith(PREFIX) and v >= 1.0]


def alert_title(signal: str, rollout_id: int) -> str:
    return f"miles red flag: {signal} at rollout {rollout_id}"[:TITLE_LIMIT]


def alert_text(signal: str, rollout_id: int, metrics: dict[str, float]) -> str:
    known = SIGNALS.get(signal)
    values = " ".join(f"{k}={metrics[k]:.4g}" for k in (known.keys if known else ()) if k in metrics)
    advice = known.advice if known else ""
    return f"{metric_name(signal)} red flag at rollout {rollout_id}. {values}. {advice}".strip()


class AlertLimiter:
    """At most one alert per signal per `interval` seconds."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic):
        self.interval, self.clock = interval, clock
        self.last: dict[str, float] = {}

    def allow(self, signal: str) -> bool:
        now = self.clock()
        before = self.last.get(signal)
        if before is not None and now - before < self.interval:
            return False
        self.last[signal] = now
        return True
