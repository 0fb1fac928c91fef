"""What each training rank is doing in a collective, and whom it waits for.

A rank in a collective of a weight push keeps one small JSON file,
RUN_DIR/collectives/rank-<N>.json: the push's weight version, the phase, the collective, its pid
and host, when it entered and a heartbeat a background thread renews while the collective runs
(`miles.backends.push_deadline`), then `done` or `failed` with the error. In training, a rank's
phase that lasts over a second (its own work, or its wait for a pipeline neighbour) is
announced the same way in train-rank-<N>.json, the rollout in place of the version
(`miles.backends.rank_activity`). A rank stopped with SIGSTOP renews nothing, a killed one leaves
its pid behind: so a rank that fails its deadline, the trainer and `miles diagnose` can all name
the peer the others wait for (`waited_for`), the same way, from the same files.
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from miles.record import layout
from miles.record.files import write_atomic
from miles.serving.process import pid_alive

WAITING, WORKING, DONE, FAILED = "waiting", "working", "done", "failed"
PUSH, TRAIN = "push", "train"  # a weight push's collectives; training's phases and barriers
BEAT_S = 0.5  # how often a rank in a collective renews its heartbeat
STALE_S = 3.0  # a heartbeat this old: the rank stopped answering (SIGSTOP, a hung process)


@dataclass
class CollectiveState:
    """One rank's place in a weight push's collectives, or in training's phases."""

    rank: int
    coords: str  # e.g. node0/dp1/pp0/tp0
    version: int  # the weight version being pushed (kind train: the rollout)
    phase: str  # e.g. weight_gather
    collective: str  # what the phase's collective is, in words
    pid: int
    host: str
    entered: float  # unix time
    beat: float  # unix time of the last heartbeat
    state: str = WAITING
    error: str = ""
    world_size: int = 0  # the ranks taking part (0: not recorded)
    kind: str = PUSH
    # kind train: the collectives the rank had gone into this rollout when the phase began
    # (`RankPhaseRecorder.arrive`); a rank with more than a working peer waits for that peer
    mark: int = 0

    @classmethod
    def entering(cls, rank: int, coords: str, version: int, phase: str, collective: str,
                 world_size: int, kind: str = PUSH, state: str = WAITING) -> "CollectiveState":
        now = time.time()
        return cls(rank, coords, version, phase, collective, os.getpid(), socket.gethostname(),
                   now, now, state, world_size=world_size, kind=kind)

    def same_step(self, other: "CollectiveState") -> bool:
        return (self.version, self.phase) == (other.version, other.phase)

    def step(self) -> str:
        return f"{'rollout' if self.kind == TRAIN else 'version'} {self.version}"

    def who(self) -> str:
        return f"rank {self.rank} ({self.coords})"


PREFIX = {PUSH: "rank-", TRAIN: "train-rank-"}


def record_path(run_dir: str | Path, rank: int, kind: str = PUSH) -> Path:
    return Path(run_dir) / layout.COLLECTIVES / f"{PREFIX[kind]}{rank}.json"


def write_state(run_dir: str | Path, state: CollectiveState) -> None:
    """Atomically: a reader never sees half a file."""
    write_atomic(record_path(run_dir, state.rank, state.kind), json.dumps(asdict(state)))


def read_states(run_dir: str | Path, kind: str = PUSH) -> dict[int, CollectiveState]:
    """Every rank's last record of `kind`, by rank (unreadable files are skipped)."""
    out = {}
    for path in sorted((Path(run_dir) / layout.COLLECTIVES).glob(f"{PREFIX[kind]}*.json")):
        try:
            state = CollectiveState(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if _well_typed(state) and state.kind == kind:
            out[state.rank] = state
    return out


def _well_typed(state: CollectiveState) -> bool:
    """Each field of the type a rank writes (a hand-edited file must not break a reader)."""
    for name, kind in (("rank", int), ("version", int), ("pid", int), ("world_size", int),
                       ("entered", (int, float)), ("beat", (int, float)), ("coords", str),
                       ("phase", str), ("collective", str), ("host", str), ("state", str),
                       ("error", str), ("kind", str), ("mark", int)):
        value = getattr(state, name)
        if not isinstance(value, kind) or isinstance(value, bool):
            return False
    return state.rank >= 0 and state.world_size <= 1 << 20


def silent(state: CollectiveState, now: float, stale_s: float = STALE_S) -> bool:
    """The rank is in its collective (or its own work) and will not answer: its process died,
    or its heartbeat stopped (none for `stale_s` seconds)."""
    return state.state in (WAITING, WORKING) and (_process_gone(state) or
                                                 now - state.beat > stale_s)


def _process_gone(state: CollectiveState) -> bool:
    """The rank's process no longer exists (judged only on its own host)."""
    return state.host == socket.gethostname() and not pid_alive(state.pid)


def why_not_done(me: CollectiveState, peer: CollectiveState | None, now: float) -> str | None:
    """Why `me` may be waiting for `peer` in its collective (None: the peer is in it, alive)."""
    if peer is None:
        return ("never entered a push collective" if me.kind == PUSH else
                "recorded no phase of over a second yet")
    working = peer.state == WORKING and peer.version == me.version
    if not peer.same_step(me) and not working:
        return f"is not in it (last in {peer.phase} of {peer.step()}: {peer.state})"
    if peer.state == FAILED:
        return f"failed in it: {peer.error[:200]}"
    if peer.state == DONE:
        return None
    where = f"in its own {peer.phase} work" if working else "in it"
    if _process_gone(peer):
        return f"died {where} (process {peer.pid} on {peer.host} is gone)"
    if now - peer.beat > STALE_S:
        return (f"stopped answering {where} (process {peer.pid} on {peer.host}, last heartbeat "
                f"{now - peer.beat:.1f} s ago)")
    if working:
        return f"is still {where} ({now - peer.entered:.0f} s so far)"
    return None


def waited_for(me: CollectiveState, states: dict[int, CollectiveState], world_size: int,
               now: float | None = None) -> list[str]:
    """The peers `me` waits for in its collective, each with why: absent from it, dead in it, or
    silent in it. Empty when every peer is there and alive (then the slow one is still working)."""
    now = time.time() if now is None else now
    out = []
    for rank in range(world_size):
        if rank == me.rank:
            continue
        peer = states.get(rank)
        reason = why_not_done(me, peer, now)
        if reason is not None and not (peer is not None and peer.state == FAILED):
            out.append(f"{peer.who() if peer else f'rank {rank}'} {reason}")
    return out


def gone(run_dir: str | Path | None, rank: int, version: int, stale_s: float = STALE_S) -> bool:
    """Rank `rank` is in a collective of the push of `version` and will not answer: its process
    died or its heartbeat stopped (none for `stale_s` seconds)."""
    if run_dir is None:
        return False
    state = read_states(run_dir).get(rank)
    return (state is not None and state.version == version
            and silent(state, time.time(), stale_s))
