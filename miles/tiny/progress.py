"""Progress lines of a warm start off a terminal (a file, a pipe, `ray job logs`), where rich's bar is off.

A warm start checks held-out accuracy every few hundred steps, 15-20 s apart on 2 busy cores; between
checks a line at most every `every_s` seconds says the step, the loss and the time so far, so a log
never sits silent for long.
"""
from __future__ import annotations

import sys
import time
from typing import Callable


class ProgressLines:
    """`tick(step, loss)` prints `[tiny] <what> step S/N, loss L, Ts` when `every_s` passed since the last line."""

    def __init__(self, what: str, total: int, enabled: bool, every_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, out=None):
        self.what, self.total, self.every_s, self.clock = what, total, every_s, clock
        self.enabled = enabled
        self.out = out
        self.start = self.last = clock()

    def tick(self, step: int, loss: float) -> bool:
        """Print a line if one is due; whether it did."""
        if not self.enabled:
            return False
        now = self.clock()
        if now - self.last < self.every_s:
            return False
        self.say(f"{self.what} step {step}/{self.total}, loss {loss:.3f}, {now - self.start:.0f}s")
        return True

    def say(self, text: str) -> None:
        """A line now (a check's result, say); the next tick waits `every_s` from here."""
        if self.enabled:
            print(f"[tiny] {text}", file=self.out or sys.stdout, flush=True)
            self.last = self.clock()


def off_terminal(progress: bool) -> bool:
    """Lines instead of the bar: progress asked for and stdout is not a terminal."""
    return progress and not sys.stdout.isatty()
