"""The `--inject-fault` test hook: fail a training chunk once at a given rollout."""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

from miles.config import ConfigError

KINDS = ("raise", "kill", "kill-engine")


class EngineDown(RuntimeError):
    """A chunk failed while one of the run's engines was down: retrying before the flow
    relaunches the engine cannot help, so Prefect does not retry it in place."""


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


def maybe_fire(spec: str | None, rollout_id: int, run_dir: Path, kill_engine=None) -> None:
    """Fire the fault at its rollout, once per run: a marker in the run dir, written first,
    keeps the retried chunk from failing again (a killed process cannot write it after)."""
    fault = parse_fault(spec)
    if fault is None or fault.rollout_id != rollout_id:
        return
    marker = Path(run_dir) / "faults" / f"{fault.kind}@{fault.rollout_id}"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(str(os.getpid()))
    if fault.kind == "kill-engine":
        kill_engine()  # engine 0's process dies as a crash would; the chunk goes on through the router
        return
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # the Ray worker running this task dies mid-chunk
    raise InjectedFault(f"--inject-fault {spec}: failing rollout {rollout_id} once")
