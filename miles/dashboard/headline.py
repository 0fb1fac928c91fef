"""Whether a run is still going, read without touching it: the run's own headline numbers (the scorecard's,
so the dashboard says what the terminal, Prefect and MLflow say) and its state: running, finished, or
stopped (first-hour N9, N14).

A trainer holds RUN_DIR/.lock for the whole of its run and writes its pid and host there; the lock is never
taken here (a shared lock, even for an instant, could refuse a trainer starting at that moment). The
holder is alive when that pid is alive on this host; a run dir from another host is "unknown".
"""
from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

from miles.record import layout
from miles.run.scorecard import duration, scorecard
from miles.serving.process import pid_alive

RUNNING, FINISHED, STOPPED, UNKNOWN = "running", "finished", "stopped", "unknown"
_HOLDER = re.compile(rb"pid (\d+) on (\S+)")


def trainer_alive(run_dir: Path) -> bool | None:
    """True: the pid in RUN_DIR/.lock is alive on this host; False: it is not (or there is no lock file);
    None: the lock names another host."""
    try:
        with open(Path(run_dir) / layout.LOCK, "rb") as f:
            text = f.read(300)
    except OSError:
        return False
    found = _HOLDER.search(text)
    if not found:
        return False
    if found.group(2).decode(errors="replace") != socket.gethostname():
        return None
    pid = int(found.group(1))
    if pid <= 0:
        return False
    try:
        return pid_alive(pid)
    except (OverflowError, ValueError):  # no pid at all
        return False


def run_state(run_dir: Path, last_rollout: int | None, num_rollout: Any) -> str:
    """finished: every planned rollout is in the journal and no trainer holds the run; running: a trainer
    does; stopped: none does and rollouts are left (a crash, a stop, or the seconds between two chunks of
    `miles train`)."""
    alive = trainer_alive(run_dir)
    if alive:
        return RUNNING
    planned = num_rollout if isinstance(num_rollout, int) and not isinstance(num_rollout, bool) else None
    if planned is not None and last_rollout is not None and last_rollout >= planned - 1:
        return FINISHED
    return UNKNOWN if alive is None else STOPPED


def summary(run_dir: Path, state: str, num_rollout: Any) -> dict[str, Any]:
    """The run's headline, from `miles.run.scorecard` (one reader of a run's end for every view)."""
    card = scorecard(run_dir)
    seconds = card.journal_seconds
    return {
        "state": state,
        "rollouts": len(card.rollouts), "num_rollout": num_rollout if isinstance(num_rollout, int) else None,
        "duration_s": seconds, "duration": duration(seconds) if seconds is not None else None,
        "duration_note": "first to last journal line (the base eval to the last rollout)",
        "eval_key": card.eval_key, "base_eval": card.base_eval, "final_eval": card.final_eval,
        "final_eval_rollout": card.final_eval_rollout,
        "reward_key": "rollout/raw_reward",
        "reward_first": list(card.reward_first) if card.reward_first else None,
        "reward_last": list(card.reward_last) if card.reward_last else None,
        "red_flags": card.flags.summary(), "red": sorted(card.flags.red), "watched": card.flags.watched,
        "verdict": verdict(card, state),
        "checkpoint": str(card.checkpoint) if card.checkpoint else None,
        "rows": [[name, value] for name, value in card.rows()],
    }


def verdict(card, state: str) -> str:
    """One line a user reads first: red flags, then whether held-out eval rose, then the state."""
    if card.flags.red:
        return f"red flags: {', '.join(sorted(card.flags.red))}"
    parts = []
    if card.base_eval is not None and card.final_eval is not None:
        change = card.final_eval - card.base_eval
        parts.append(f"held-out eval {'rose' if change > 0 else 'did not rise'} ({change:+.3f})")
    parts.append("no red flags" if card.flags.watched else "no health watch")
    return f"{state}: " + ", ".join(parts)
