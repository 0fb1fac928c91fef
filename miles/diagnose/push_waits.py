"""Whom a collective waits for, in words, from the ranks' records.

Each training rank in a collective of a weight push keeps RUN_DIR/collectives/rank-<N>.json with a
heartbeat, and announces a training phase of over a second (its own work, or its wait for a
pipeline neighbour; with how many collectives it had gone into) in train-rank-<N>.json
(`miles.run.collective_waits`). Of the newest push (and the newest rollout) recorded, a rank still waiting gets a line naming the peers it waits for (absent from
the collective, dead in it, silent in it, or still in its own work); a rank whose push failed gets
its own error (which names them too). Ranks that are themselves dead or silent get no line: the
others name them.
"""
from __future__ import annotations

import time
from pathlib import Path

from miles.run.collective_waits import (FAILED, PUSH, TRAIN, WAITING, WORKING, read_states,
                                        silent, waited_for, why_not_done)


def _printable(text: str, limit: int) -> str:
    """A record's text as one plain line (a crafted file cannot drive the terminal)."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


def push_wait_lines(run_dir: Path, now: float | None = None) -> list[str]:
    """The weight push's lines, then training's (see the module)."""
    now = time.time() if now is None else now
    return _lines(run_dir, PUSH, now) + _lines(run_dir, TRAIN, now)


def _lines(run_dir: Path, kind: str, now: float) -> list[str]:
    states = read_states(run_dir, kind)
    if not states:
        return []
    newest = max(s.version for s in states.values())
    step = {rank: s for rank, s in states.items() if s.version == newest}
    world = max([s.world_size for s in step.values()] + [max(step) + 1])
    lines = []
    for rank in sorted(step):
        state = step[rank]
        if state.state == FAILED:
            lines.append(_printable(state.error, 600))
        elif state.state == WAITING and not silent(state, now):
            peers = waited_for(state, states, world, now)
            whom = "; ".join(peers) or "no peer is absent or silent (one is still working)"
            what = "weight push of " if kind == PUSH else ""
            lines.append(_printable(
                f"{what}{state.step()}: {state.who()} has waited {now - state.entered:.0f} s "
                f"in {state.phase} ({state.collective}) for: {whom}", 600))
        elif state.state == WORKING and not silent(state, now):
            lines += _behind_line(state, step, now) or _working_line(state, states, world, now)
    return lines


def _behind_line(state, step: dict, now: float) -> list[str]:
    """A training rank that has gone into more collectives this rollout than a live peer (its
    `mark`) waits in its collective for that peer: a line naming the peers behind it."""
    behind = [peer for rank, peer in sorted(step.items()) if rank != state.rank
              and peer.kind == TRAIN and peer.state == WORKING
              and not silent(peer, now) and peer.mark < state.mark]
    if not behind:
        return []
    whom = "; ".join(f"{peer.who()} is still in its own {peer.phase} work "
                     f"({now - peer.entered:.0f} s so far)" for peer in behind)
    return [_printable(f"{state.step()}: {state.who()} has waited {now - state.entered:.0f} s "
                       f"in {state.phase} ({state.collective}) for: {whom}", 600)]


def _working_line(state, states, world: int, now: float) -> list[str]:
    """A rank long in its own work whose passes hold collectives (FSDP's gathers): a line only
    when a peer is absent from the phase, silent or gone (one still working is no finding)."""
    away = []
    for rank in range(world):
        peer = states.get(rank)
        here = peer is not None and peer.version == state.version and \
            peer.state in (WAITING, WORKING) and not silent(peer, now)  # working, or waiting on it
        reason = None if rank == state.rank or here else why_not_done(state, peer, now)
        if reason is not None:
            away.append(f"{peer.who() if peer else f'rank {rank}'} {reason}")
    if not away:
        return []
    return [_printable(f"{state.step()}: {state.who()} has been in its own {state.phase} work "
                       f"for {now - state.entered:.0f} s (a collective inside it waits for its "
                       f"peers); away: {'; '.join(away)}", 600)]
