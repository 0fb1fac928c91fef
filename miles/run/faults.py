"""The `--inject-fault` test hook as a loop observer: fail the run, or one engine, once at a given rollout.

The flag takes one fault or a comma-separated list (`raise@1,kill-engine:1@3`), so one run can fire
several; each fires once, at most one per rollout.

`raise@R` and `kill@R` fail the process running the loop before rollout R. `kill-engine[:N]@R` (SIGKILL)
and `stop-engine[:N]@R` (SIGSTOP: alive, never answering) hit engine N (default 0) as rollout R starts
(`kill-router@R`: the router; `abort-engine[:N]@R`: engine N aborts every request of rollout R, an abort storm),
so that rollout's requests meet the fault: refused by a dead engine (the router fails them over, or with
one engine the client waits for its relaunch), or held by a stopped one until the supervisor finds it hung.
(Waiting for a request in flight first was tried: the tiny rollouts end before a poll of the router sees one.)

`slow-rank:N:PHASE[:SECONDS]@R` makes training rank N (its index in the world) a straggler: it sleeps
SECONDS (default 1) at the end of its first span of PHASE (`miles.run.stragglers.RANK_PHASES`) in
rollout R, inside the rank (`miles.backends.rank_phases`); the loop's injector leaves it alone.

`kill-rank:N@R` (SIGKILL) and `stall-rank:N@R` (SIGSTOP: alive, never answering) hit training rank N
inside the weight push after rollout R, as it enters the push's weight gather (a collective): the
other ranks are in it and wait for it until the push's deadline (--update-weight-timeout) fails them
(`miles.backends.push_deadline`). Also fired inside the rank, not by the loop's injector.

`slow-engine-apply:N[:SECONDS]@R` makes engine N (its index in the run's engine list; embedded
engines) a weight-sync straggler: it sleeps SECONDS (default 1) in its apply of every push from
the one after rollout R on (weight version R + 1), inside the engine (`miles engine
--inject-slow-apply`, `miles.engines.push_spans.slow_apply_of`); the loop's injector leaves it
alone.
"""
from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from miles.config import ConfigError
from miles.engines.push_spans import SLOW_ENGINE_SPEC
from miles.record import layout
from miles.run.observer import Observer
from miles.run.stragglers import RANK_PHASES

KINDS = ("raise", "kill", "kill-engine", "stop-engine", "abort-engine", "kill-router", "slow-rank",
         "kill-rank", "stall-rank", "slow-engine-apply")
INSIDE = ("slow-rank", "kill-rank", "stall-rank", "slow-engine-apply")  # fired by a rank or engine
ENGINE_KINDS = ("kill-engine", "stop-engine", "abort-engine")
PUSH_RANK_KINDS = ("kill-rank", "stall-rank")  # fired inside a training rank's weight push
NUMBERED = ENGINE_KINDS + PUSH_RANK_KINDS
SPEC = re.compile(r"^(?P<kind>[a-z-]+)(?::(?P<engine>\d+))?@(?P<at>\d+)$")
SLOW_SPEC = re.compile(r"^slow-rank:(?P<rank>\d+):(?P<phase>[a-z_]+)"
                       r"(?::(?P<seconds>\d+(?:\.\d+)?))?@(?P<at>\d+)$")


class InjectedFault(RuntimeError):
    """The failure `--inject-fault raise@ITER` asked for."""


class FaultTargets(Protocol):
    """The inference services a fault can hit (a plain run's `InferenceServices`)."""

    def kill_engine(self, index: int) -> int: ...
    def stop_engine(self, index: int) -> int: ...
    def abort_engine(self, index: int, count: int) -> object: ...
    def kill_router(self) -> int: ...


@dataclass(frozen=True)
class Fault:
    kind: str
    rollout_id: int
    engine: int = 0  # slow-rank: the rank
    phase: str = ""  # slow-rank: the phase it is slow in, and by how many seconds
    seconds: float = 0.0

    @property
    def marker(self) -> str:
        """The marker file's name (engine 0 unnamed, as before engines were numbered)."""
        return f"{self.kind}@{self.rollout_id}" if self.engine == 0 else self.name

    @property
    def name(self) -> str:
        if self.kind == "slow-rank":
            return f"slow-rank:{self.engine}:{self.phase}:{self.seconds:g}@{self.rollout_id}"
        if self.kind == "slow-engine-apply":
            return f"slow-engine-apply:{self.engine}:{self.seconds:g}@{self.rollout_id}"
        return f"{self.kind}:{self.engine}@{self.rollout_id}" if self.kind in NUMBERED else \
            f"{self.kind}@{self.rollout_id}"


@dataclass(frozen=True)
class SlowRank:
    """What `slow-rank:N:PHASE[:SECONDS]@R` asks of rank N: sleep in PHASE of rollout R."""

    phase: str
    seconds: float
    rollout_id: int


def slow_rank(spec: str | None, rank: int) -> SlowRank | None:
    """The slow-rank fault of `--inject-fault` aimed at training rank `rank`, if any."""
    for fault in parse_faults(spec):
        if fault.kind == "slow-rank" and fault.engine == rank:
            return SlowRank(fault.phase, fault.seconds, fault.rollout_id)
    return None


def push_fault(spec: str | None, rank: int) -> Fault | None:
    """The kill-rank or stall-rank fault of `--inject-fault` aimed at training rank `rank`."""
    for fault in parse_faults(spec):
        if fault.kind in PUSH_RANK_KINDS and fault.engine == rank:
            return fault
    return None


def _parse_slow_engine(spec: str) -> Fault:
    match = SLOW_ENGINE_SPEC.match(spec)
    if match is None:
        raise ConfigError("--inject-fault", "expected slow-engine-apply:ENGINE[:SECONDS]@ITER, "
                                            f"got {spec!r}")
    return Fault("slow-engine-apply", int(match["at"]), int(match["engine"]),
                 seconds=float(match["seconds"] or 1.0))


def _parse_slow_rank(spec: str) -> Fault:
    match = SLOW_SPEC.match(spec)
    if match is None or match["phase"] not in RANK_PHASES:
        raise ConfigError("--inject-fault", f"expected slow-rank:RANK:PHASE[:SECONDS]@ITER with "
                                            f"PHASE one of {', '.join(RANK_PHASES)}, got {spec!r}")
    return Fault("slow-rank", int(match["at"]), int(match["rank"]), match["phase"],
                 float(match["seconds"] or 1.0))


def parse_fault(spec: str | None) -> Fault | None:
    """One fault (`kind[:N]@ITER`), or None for no spec."""
    if not spec:
        return None
    if spec.strip().startswith("slow-rank"):
        return _parse_slow_rank(spec.strip())
    if spec.strip().startswith("slow-engine-apply"):
        return _parse_slow_engine(spec.strip())
    match = SPEC.match(spec.strip())
    numbered = match is not None and match["engine"] and match["kind"] not in NUMBERED
    if match is None or match["kind"] not in KINDS or numbered:
        raise ConfigError("--inject-fault",
                          "expected raise@ITER, kill@ITER, kill-engine[:N]@ITER, "
                          "stop-engine[:N]@ITER, abort-engine[:N]@ITER, kill-router@ITER, "
                          "slow-rank:RANK:PHASE[:SECONDS]@ITER, kill-rank[:N]@ITER, "
                          "stall-rank[:N]@ITER or slow-engine-apply:ENGINE[:SECONDS]@ITER, "
                          f"got {spec!r}")
    return Fault(match["kind"], int(match["at"]), int(match["engine"] or 0))


def parse_faults(spec: str | None) -> tuple[Fault, ...]:
    """Every fault of a comma-separated `--inject-fault` list, in rollout order. Two faults at one rollout are
    refused: the first one to fail the loop would keep the other from ever firing."""
    if not spec:
        return ()
    parts = spec.split(",")
    if not all(part.strip() for part in parts):
        raise ConfigError("--inject-fault", f"an empty fault in {spec!r}: list them as raise@1,kill-engine@3")
    faults = sorted((parse_fault(part) for part in parts), key=lambda fault: fault.rollout_id)
    for before, after in zip(faults, faults[1:]):
        if before.rollout_id == after.rollout_id:
            raise ConfigError("--inject-fault", f"{before.name} and {after.name} both fire at rollout "
                                                f"{after.rollout_id}: give each fault its own rollout")
    return tuple(faults)


def check_faults(spec: str | None, world_size: int, engines: int | None = None,
                 embedded: bool = True) -> None:
    """Before a run starts: the spec parses, a slow rank is one of the run's training ranks and a
    slow engine one of its (embedded) engines."""
    for fault in parse_faults(spec):
        if fault.kind in ("slow-rank", *PUSH_RANK_KINDS) and fault.engine >= world_size:
            raise ConfigError("--inject-fault", f"{fault.name}: there is no training rank {fault.engine} "
                                                f"(ranks 0..{world_size - 1})")
        if fault.kind != "slow-engine-apply":
            continue
        if not embedded:
            raise ConfigError("--inject-fault", f"{fault.name}: only the embedded engine takes it")
        if engines is not None and fault.engine >= engines:
            raise ConfigError("--inject-fault", f"{fault.name}: there is no engine {fault.engine} "
                                                f"(engines 0..{engines - 1})")


def require_healable(spec: str | None, supervised: bool) -> None:
    """`miles train` without --use-fault-tolerance (`supervised`): a dead engine fails its chunk's
    task, which the flow resubmits from the chunk's last checkpoint after relaunching the engine; a
    stopped engine or a killed router would only hang or fail that chunk. So those faults need the
    supervisor: said before anything starts."""
    for fault in parse_faults(spec):
        if not supervised and fault.kind in ("stop-engine", "kill-router"):
            raise ConfigError("--inject-fault",
                              f"{fault.name!r} needs --use-fault-tolerance in `miles train` "
                              f"(without it only kill-engine[:N]@ITER, healed by a chunk retry)")


class FaultInjector(Observer):
    """Fires each fault at its rollout, once per run: a marker in the run dir, written first, keeps
    the retried chunk from failing again (a killed process cannot write it after)."""

    def __init__(self, spec: str | None, run_dir: str | Path, kill_engine: Callable[[], object] | None = None,
                 targets: FaultTargets | None = None, rollout_requests: int = 0):
        self.faults, self.run_dir, self.kill_engine, self.targets = parse_faults(spec), Path(run_dir), kill_engine, \
            targets
        self.rollout_requests = rollout_requests  # abort-engine: how many requests a storm aborts at most
        self.storm = None

    def before_iteration(self, rollout_id: int) -> None:
        for fault in self.faults:
            if fault.rollout_id == rollout_id and fault.kind not in INSIDE:
                self._fire(fault, rollout_id)

    def _fire(self, fault: Fault, rollout_id: int) -> None:
        marker = self.run_dir / layout.FAULTS / fault.marker
        if marker.exists():
            return
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(os.getpid()))
        if fault.kind in ENGINE_KINDS:
            self._hit_engine(fault)
            return
        if fault.kind == "kill-router":
            if self.targets is None:
                raise ConfigError("--inject-fault", "kill-router needs the router of `python -m miles.train`")
            pid = self.targets.kill_router()
            print(f"[trainer] --inject-fault {fault.name}: SIGKILL the router (pid {pid}) as rollout "
                  f"{fault.rollout_id} starts", flush=True)
            return
        if fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)  # the process running the loop dies mid-run
        raise InjectedFault(f"--inject-fault {fault.kind}@{fault.rollout_id}: failing rollout {rollout_id} once")

    def after_iteration(self, result):
        self._end_storm()
        return None

    def end(self, outcome) -> None:
        self._end_storm()

    def _end_storm(self) -> None:
        """The storm lasts one rollout: the engine takes requests again before the next."""
        if self.storm is not None:
            self.storm.stop()
            self.storm = None

    def _hit_engine(self, fault: Fault) -> None:
        if self.targets is not None and fault.kind == "abort-engine":
            self.storm = self.targets.abort_engine(fault.engine, self.rollout_requests)
            print(f"[trainer] --inject-fault {fault.name}: engine {fault.engine} aborts the requests of rollout "
                  f"{fault.rollout_id}", flush=True)
            return
        if self.targets is not None:
            hit = self.targets.kill_engine if fault.kind == "kill-engine" else self.targets.stop_engine
            pid = hit(fault.engine)
            print(f"[trainer] --inject-fault {fault.name}: {'SIGKILL' if fault.kind == 'kill-engine' else 'SIGSTOP'}"
                  f" engine {fault.engine} (pid {pid}) as rollout {fault.rollout_id} starts", flush=True)
            return
        if fault.kind != "kill-engine" or fault.engine != 0 or self.kill_engine is None:
            raise ConfigError("--inject-fault", f"{fault.name} needs the engines of `python -m miles.train`; "
                                                f"`miles train` can only kill-engine@ITER (engine 0)")
        self.kill_engine()  # engine 0's process dies as a crash would; the chunk goes on through the router
