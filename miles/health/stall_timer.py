"""The health watch on a timer: a daemon thread that checks the phase open now every
--health-stall-check-interval seconds and reacts to the first live stall, once.

The per-iteration watch only sees an iteration once it ended; a hung phase never does. The
first live `stall` red flag is printed as a WARN line, appended to `RUN_DIR/health.jsonl`
(marked `"live": true`) and handed to `react` (the caller's reaction: the diagnose bundle, the
alerts, `--on-red-flag stop`). It fires once per watch: a hang gets one bundle, not one a tick.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Callable

from miles.config.health import HealthConfig
from miles.health.open_phase import PhaseCache, check_open_phase
from miles.health.signals import Verdict
from miles.record import layout

log = logging.getLogger(__name__)


class StallTimer:
    def __init__(self, run_dir: Path, cfg: HealthConfig, react: Callable[[Verdict], None],
                 clock: Callable[[], float] = time.time):
        self.run_dir, self.cfg, self.react, self.clock = Path(run_dir), cfg, react, clock
        self.stopped = threading.Event()
        self.fired: Verdict | None = None
        self.cache = PhaseCache()
        self.reacted = threading.Event()  # set once `react` returned (or failed)
        self.thread = threading.Thread(target=self._loop, name="health-stall-timer", daemon=True)

    @property
    def enabled(self) -> bool:
        return self.cfg.health_watch == "on" and self.cfg.health_stall_check_interval > 0

    def start(self) -> "StallTimer":
        if self.enabled:
            self.thread.start()
        return self

    def check(self) -> Verdict | None:
        """One check; the verdict the first time a live stall is seen (and the reaction run), else None."""
        if self.fired is not None:
            return None
        verdict = check_open_phase(self.run_dir, self.clock(), self.cfg, self.cache)
        if verdict is None:
            return None
        self.fired = verdict
        print(verdict.line(), flush=True)
        with (self.run_dir / layout.HEALTH).open("a") as f:
            f.write(json.dumps(verdict.as_json()) + "\n")
        try:
            self.react(verdict)
        finally:
            self.reacted.set()
        return verdict

    def _loop(self) -> None:
        while not self.stopped.wait(self.cfg.health_stall_check_interval) and self.fired is None:
            try:
                self.check()
            except Exception:  # a background watch: training goes on
                log.exception("health stall check failed")

    def stop(self) -> None:
        self.stopped.set()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout=5.0)
