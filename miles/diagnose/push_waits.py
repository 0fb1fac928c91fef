"""Whom a weight push's collective waits for, in words, from the ranks' records.

Each training rank in a collective of a weight push keeps RUN_DIR/collectives/rank-<N>.json with a
heartbeat (`miles.run.collective_waits`). Of the newest push recorded, a rank still waiting gets a
line naming the peers it waits for (absent from the collective, dead in it, or silent in it); a
rank whose push failed gets its own error (which names them too). Ranks that are themselves dead
or silent get no line: the others name them.
"""
from __future__ import annotations

import time
from pathlib import Path

from miles.run.collective_waits import FAILED, WAITING, read_states, silent, waited_for


def _printable(text: str, limit: int) -> str:
    """A record's text as one plain line (a crafted file cannot drive the terminal)."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


def push_wait_lines(run_dir: Path, now: float | None = None) -> list[str]:
    """One line per rank of the newest recorded push that waits in a collective or failed in it."""
    now = time.time() if now is None else now
    states = read_states(run_dir)
    if not states:
        return []
    newest = max(s.version for s in states.values())
    push = {rank: s for rank, s in states.items() if s.version == newest}
    world = max([s.world_size for s in push.values()] + [max(push) + 1])
    lines = []
    for rank in sorted(push):
        state = push[rank]
        if state.state == FAILED:
            lines.append(_printable(state.error, 600))
        elif state.state == WAITING and not silent(state, now):
            peers = waited_for(state, states, world, now)
            whom = "; ".join(peers) or "no peer is absent or silent (one is still working)"
            lines.append(_printable(
                f"weight push of version {newest}: {state.who()} has waited "
                f"{now - state.entered:.0f} s in {state.phase} ({state.collective}) for: {whom}",
                600))
    return lines
