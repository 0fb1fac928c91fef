"""The `--inject-fault` test hook as a loop observer: fail the run once at a given rollout."""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from miles.config import ConfigError
from miles.record import layout
from miles.run.observer import Observer

KINDS = ("raise", "kill", "kill-engine")


class InjectedFault(RuntimeError):
    """The failure `--inject-fault raise@ITER` asked for."""


@dataclass(frozen=True)
class Fault:
    kind: str
    rollout_id: int


def parse_fault(spec: str | None) -> Fault | None:
    if not spec:
        return None
    kind, sep, at = spec.partition("@")
    if kind not in KINDS or not sep or not at.isdigit():
        raise ConfigError("--inject-fault", f"expected raise@ITER, kill@ITER or kill-engine@ITER, got {spec!r}")
    return Fault(kind, int(at))


class FaultInjector(Observer):
    """Fires the fault before its rollout, once per run: a marker in the run dir, written first, keeps
    the retried chunk from failing again (a killed process cannot write it after)."""

    def __init__(self, spec: str | None, run_dir: str | Path, kill_engine: Callable[[], object] | None = None):
        self.fault, self.run_dir, self.kill_engine = parse_fault(spec), Path(run_dir), kill_engine

    def before_iteration(self, rollout_id: int) -> None:
        fault = self.fault
        if fault is None or fault.rollout_id != rollout_id:
            return
        marker = self.run_dir / layout.FAULTS / f"{fault.kind}@{fault.rollout_id}"
        if marker.exists():
            return
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(os.getpid()))
        if fault.kind == "kill-engine":
            if self.kill_engine is None:
                raise ConfigError("--inject-fault", "kill-engine needs the Prefect flow (`miles train`)")
            self.kill_engine()  # engine 0's process dies as a crash would; the chunk goes on through the router
            return
        if fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)  # the process running the loop dies mid-run
        raise InjectedFault(f"--inject-fault {fault.kind}@{fault.rollout_id}: failing rollout {rollout_id} once")
