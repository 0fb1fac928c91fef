"""An engine's own phases of a weight push, as spans on its timeline lane (issue 54).

The phases: `receive` (the new weights arriving and checked: a disk load's read, a tensor push's
body, one broadcast bucket), `apply` (the swap into the served model), `pause` (answering
/pause_generation) and `continue` (answering /continue_generation; its `paused_s` is how long the
engine's generation stood paused, the pause window as the engine saw it). As on a training rank's
lane, time the engine spends waiting on someone else is a span named `wait` with the `phase` it
waited in: a broadcast push's gap between one bucket's answer and the next bucket's arrival (the
engine waiting on the sender), and the swap's wait for the running batch to end. Every span
carries `kind` (compute or wait) and the engine's coordinates: `engine` (its index in the run's
engine list, `miles engine --engine-index`), `url` and `coords` (`engine<i> <url>`), and the weight
version where the engine knows it (a broadcast bucket before the last does not).

The trainer reads these spans back after a push (`miles.run.engine_stragglers`) for the spread of
the engines' own receive+apply time: with the broadcast path every engine answers the sender
together, so only the engine's own clock tells a slow one apart.

`--inject-slow-apply SECONDS@VERSION` (test-only; `--inject-fault slow-engine-apply:N[:SECONDS]@R`
passes it to engine N) sleeps SECONDS in the apply of every push from weight version VERSION on.
"""
from __future__ import annotations

import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from miles.config import ConfigError
from miles.record.timeline import TimelineWriter

COMPUTE, WAIT = "compute", "wait"
PHASES = ("receive", "apply", "pause", "continue")
SLOW_APPLY = re.compile(r"^(?P<seconds>\d+(?:\.\d+)?)@(?P<version>\d+)$")
# --inject-fault's slow-engine-apply:N[:SECONDS]@R (miles.run.faults parses the whole list with it)
SLOW_ENGINE_SPEC = re.compile(r"^slow-engine-apply:(?P<engine>\d+)"
                              r"(?::(?P<seconds>\d+(?:\.\d+)?))?@(?P<at>\d+)$")


@dataclass(frozen=True)
class EngineCoords:
    """Where an engine sits: its index in the run's engine list (None: started alone) and URL."""

    index: int | None
    url: str

    @property
    def name(self) -> str:
        """e.g. `engine1 http://127.0.0.1:30001`: how spans and messages name the engine."""
        return f"engine{self.index} {self.url}" if self.index is not None else f"engine {self.url}"


@dataclass(frozen=True)
class SlowApply:
    """The test-only fault: sleep `seconds` in the apply of every version from `from_version` on."""

    seconds: float
    from_version: int

    def hits(self, version: str | None) -> bool:
        return version is not None and version.isdigit() and int(version) >= self.from_version


def slow_apply_of(inject_fault: str | None, engine: int) -> str | None:
    """--inject-slow-apply's SECONDS@VERSION for engine `engine`, from a slow-engine-apply fault
    aimed at it in an --inject-fault list (checked before the run starts): the push after rollout
    R carries weight version R + 1."""
    for part in (inject_fault or "").split(","):
        match = SLOW_ENGINE_SPEC.match(part.strip())
        if match is not None and int(match["engine"]) == engine:
            return f"{float(match['seconds'] or 1.0):g}@{int(match['at']) + 1}"
    return None


def parse_slow_apply(spec: str | None) -> SlowApply | None:
    """`SECONDS@VERSION` of --inject-slow-apply, or None."""
    if not spec:
        return None
    match = SLOW_APPLY.match(spec.strip())
    if match is None:
        raise ConfigError("--inject-slow-apply", f"expected SECONDS@VERSION (0.5@2), got {spec!r}")
    return SlowApply(float(match["seconds"]), int(match["version"]))


class PushSpans:
    """Writes one engine's push spans; with `TimelineWriter(None)` it times and writes nothing."""

    def __init__(self, timeline: TimelineWriter, coords: EngineCoords,
                 slow: SlowApply | None = None):
        self.timeline, self.coords, self.slow = timeline, coords, slow
        self._answered: dict[str, float] = {}  # group -> when its last staged bucket was answered
        self._paused_at: float | None = None

    def add(self, phase: str, kind: str, start: float, end: float, version: str | None = None,
            **extra) -> None:
        if self.timeline.path is None:
            return
        args = {"kind": kind, "url": self.coords.url, "coords": self.coords.name}
        if self.coords.index is not None:
            args["engine"] = self.coords.index
        if kind == WAIT:
            args["phase"] = phase
        if version is not None:
            args["weight_version"] = version
        self.timeline.add(phase if kind == COMPUTE else "wait", start, end, **args, **extra)

    @contextmanager
    def span(self, phase: str, version: str | None = None, **extra) -> Iterator[None]:
        """The block is this engine's own work in `phase` (written also when it fails)."""
        start = time.time()
        try:
            yield
        finally:
            self.add(phase, COMPUTE, start, time.time(), version, **extra)

    def timed_apply(self, apply: Callable[[], None], version: str | None) -> Callable[[], None]:
        """`apply` for the scheduler thread: its wait for the running batch (from now until it
        starts) is a wait span, the swap itself the apply span."""
        queued = time.time()

        def run() -> None:
            began = time.time()
            self.add("apply", WAIT, queued, began, version)
            try:
                apply()
                if self.slow is not None and self.slow.hits(version):
                    time.sleep(self.slow.seconds)  # the test-only fault: this engine applies late
            finally:
                self.add("apply", COMPUTE, began, time.time(), version)

        return run

    def bucket_arrived(self, group: str, arrived: float) -> None:
        """A broadcast bucket's request arrived: the engine waited on the sender since the group's
        previous bucket was answered (nothing before a push's first bucket)."""
        last = self._answered.pop(group, None)
        if last is not None:
            self.add("receive", WAIT, last, arrived, group=group)

    def bucket_answered(self, group: str, staged: bool) -> None:
        """A bucket was answered: staged (more follow), or the last or a failed one (none
        follows)."""
        if staged:
            self._answered[group] = time.time()
        else:
            self._answered.pop(group, None)

    def paused(self, start: float, mode: str | None) -> None:
        end = time.time()
        self.add("pause", COMPUTE, start, end, mode=mode or "queued")
        self._paused_at = end

    def continued(self, start: float) -> None:
        extra = {} if self._paused_at is None else {"paused_s": round(start - self._paused_at, 6)}
        self._paused_at = None
        self.add("continue", COMPUTE, start, time.time(), **extra)
