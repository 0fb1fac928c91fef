"""One poll with a deadline for every test: a readiness check, never a fixed sleep."""
from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, what: str, *, interval: float = 0.05,
             gone: Callable[[], str | None] | None = None, context: Callable[[], str] | None = None) -> T:
    """Poll `predicate` until it returns something truthy and return that; fail naming `what` after `timeout`
    seconds. `gone()` (optional) says why waiting is pointless (the process watched has ended) and fails at
    once; `context()` (optional) is added to either failure (a log's tail)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        why = gone() if gone is not None else None
        if why or time.monotonic() > deadline:
            message = f"{why} before {what}" if why else f"timed out after {timeout}s waiting for {what}"
            raise AssertionError(message + (f":\n{context()}" if context is not None else ""))
        time.sleep(interval)
