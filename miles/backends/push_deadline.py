"""A training rank's collectives of a weight push, each bounded by a deadline.

`PushWatch.collective(version, phase, what)` wraps one collective of a push (the weight gather:
FSDP all-gathers its shards, Megatron gathers its TP/PP shards). For the block:
- every process group this rank belongs to waits at most `--update-weight-timeout` seconds per
  operation (gloo: each group's timeout is lowered for the block and put back after; on NCCL the
  same timeout feeds its watchdog), so a peer that died or stopped cannot hold the rank longer;
- the rank records where it is (`miles.run.collective_waits`, RUN_DIR/collectives/rank-<N>.json)
  and a thread renews its heartbeat there, so whoever is left can tell an absent, dead or silent
  peer from a slow one.
When the collective fails (its deadline passed, or a peer's connection closed), the rank raises
`PushDeadlineError` naming the push's version, the phase, the collective, how long it waited and
the peers it waited for. `--inject-fault kill-rank:N@R` / `stall-rank:N@R` fire here, as rank N
enters the gather of the push after rollout R.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist

from miles.record import layout
from miles.run.collective_waits import (BEAT_S, DONE, FAILED, STALE_S, WORKING,
                                        CollectiveState, read_states, waited_for, write_state)
from miles.run.faults import Fault
from miles.run.stragglers import RankCoords


class PushDeadlineError(RuntimeError):
    """A collective of a weight push failed on this rank; the message names the peers."""


class PushWatch:
    """One rank's deadline and records for the collectives of its weight pushes."""

    def __init__(self, rank: int, world_size: int, coords: RankCoords, timeout_s: float,
                 run_dir: str | None, fault: Fault | None = None):
        self.rank, self.world_size, self.coords = rank, world_size, coords
        self.timeout_s, self.run_dir, self.fault = timeout_s, run_dir, fault
        self.rollout_id: int | None = None  # the last rollout this rank trained (faults aim at it)

    @contextmanager
    def collective(self, version: int, phase: str, what: str) -> Iterator[None]:
        """The block is one collective of the push of `version` (see the module)."""
        if not dist.is_initialized() or self.world_size < 2:
            yield
            return
        state = CollectiveState.entering(self.rank, self.coords.name, version, phase, what,
                                         self.world_size)
        self._record(state)
        beat = _Heartbeat(self, state)
        beat.start()
        try:
            self._maybe_fire()
            with bounded_groups(self.timeout_s):
                yield
        except Exception as exc:
            beat.stop()
            raise self._failure(state, exc) from None
        finally:
            beat.stop()
        state.state = DONE
        self._record(state)

    @contextmanager
    def working(self, version: int, phase: str, what: str) -> Iterator[None]:
        """The block is this rank's own part of the push of `version` with no peer rank in it
        (a source rank's send to the engines, bounded by its engine calls): recorded, heartbeat
        renewed, so the trainer can tell a rank stopped in it (SIGSTOP) from a slow one and need
        not wait for it forever. What the block raises passes through as it is."""
        state = CollectiveState.entering(self.rank, self.coords.name, version, phase, what,
                                         self.world_size, state=WORKING)
        self._record(state)
        beat = _Heartbeat(self, state)
        beat.start()
        try:
            yield
        except Exception as exc:
            beat.stop()
            state.state, state.error = FAILED, _first_line(exc)
            self._record(state)
            raise
        finally:
            beat.stop()
        state.state = DONE
        self._record(state)

    def _failure(self, state: CollectiveState, exc: Exception) -> PushDeadlineError:
        """The error naming whom this rank waited for; recorded as this rank's state."""
        waited = time.time() - state.entered
        peers = self._peers(state)
        whom = "; ".join(peers) if peers else "no peer found absent or silent (see the cause)"
        message = (f"weight push of version {state.version}, phase {state.phase} "
                   f"({state.collective}): rank {self.rank} ({self.coords.name}) failed after "
                   f"{waited:.1f} s (deadline --update-weight-timeout {self.timeout_s:g} s), "
                   f"waiting for: {whom}. Cause: {_first_line(exc)}")
        state.state, state.error = FAILED, message
        self._record(state)
        return PushDeadlineError(message)

    def _peers(self, state: CollectiveState) -> list[str]:
        """The peers the records name; a collective that failed at once (a closed connection)
        gets up to STALE_S for a silent peer's heartbeat to age."""
        if self.run_dir is None:
            return []
        until = time.time() + STALE_S + BEAT_S
        while True:
            peers = waited_for(state, read_states(self.run_dir), self.world_size)
            if peers or time.time() > until:
                return peers
            time.sleep(BEAT_S)

    def _record(self, state: CollectiveState) -> None:
        if self.run_dir is not None:
            try:
                write_state(self.run_dir, state)
            except OSError:  # a full disk must not turn a push into a failure of its own
                pass

    def _maybe_fire(self) -> None:
        """--inject-fault kill-rank / stall-rank: once per run (a marker in RUN_DIR/faults)."""
        fault = self.fault
        if fault is None or fault.rollout_id != self.rollout_id:
            return
        if self.run_dir is not None:
            marker = Path(self.run_dir) / layout.FAULTS / fault.name
            if marker.exists():
                return
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(str(os.getpid()))
        print(f"[rank {self.rank}] --inject-fault {fault.name}: "
              f"{'SIGKILL' if fault.kind == 'kill-rank' else 'SIGSTOP'} this rank "
              f"(pid {os.getpid()}) in the weight gather", flush=True)
        os.kill(os.getpid(), signal.SIGKILL if fault.kind == "kill-rank" else signal.SIGSTOP)


class _Heartbeat:
    """Renews a rank's record every BEAT_S while its collective runs (a daemon thread: the
    collective's C++ wait releases the GIL)."""

    def __init__(self, watch: PushWatch, state: CollectiveState):
        self.watch, self.state = watch, state
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="miles-push-heartbeat")

    def start(self) -> None:
        if self.watch.run_dir is not None:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(BEAT_S):
            self.state.beat = time.time()
            self.watch._record(self.state)


@contextmanager
def bounded_groups(timeout_s: float) -> Iterator[None]:
    """Every process group of this rank waits at most `timeout_s` per operation in the block."""
    limit = timedelta(seconds=timeout_s)
    changed = []
    backends = {id(b): b for group in list(dist.distributed_c10d._world.pg_map)
                for b in _backends(group)}  # a device without its own backend gives the same one
    for backend in backends.values():
        setter = getattr(backend, "_set_default_timeout", None)
        before = getattr(getattr(backend, "options", None), "_timeout", None)
        if setter is None or before is None:
            continue
        setter(limit)
        changed.append((setter, before))
    try:
        yield
    finally:
        for setter, before in reversed(changed):
            setter(before)


def _backends(group) -> list:
    out = []
    for device in ("cpu", "cuda"):
        try:
            out.append(group._get_backend(torch.device(device)))
        except (RuntimeError, ValueError):
            continue
    return out


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__
