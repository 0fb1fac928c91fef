"""`miles replay-spool RUN_DIR`: deliver the committed points a tracker missed (an outage that
outlived the run), then store the run's artifacts and finish its tracker runs."""
from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from miles.config.fields import is_secret_name
from miles.tracking.delivery import worker_for
from miles.tracking.secrets import MIN_SECRET_LEN, Scrubber
from miles.tracking.state import (COMMITTED_PATH, DELIVERY_LOCK_PATH, CommitState, DeliveryState, SinkState,
                                  TrackingState, try_delivery_lock)


class DeliveryBusy(RuntimeError):
    pass


def env_secrets() -> tuple[str, ...]:
    return tuple(v for k, v in os.environ.items() if is_secret_name(k) and len(v) >= MIN_SECRET_LEN)


def replay(run_dir: Path, timeout: float) -> dict[str, int]:
    """Deliver every spooled line; returns what is still undelivered per tracker (empty: all done).
    Holds the run dir's delivery lock meanwhile, as the run's delivery process does."""
    if not TrackingState.load(run_dir).exists():
        raise FileNotFoundError(f"{run_dir} has no {COMMITTED_PATH}: not a run directory")
    lock = try_delivery_lock(run_dir)
    if lock is None:
        raise DeliveryBusy(f"{run_dir / DELIVERY_LOCK_PATH} is held: a delivery process of this run dir is still "
                           f"running")
    with lock:
        commits, state = CommitState.load(run_dir), DeliveryState.load(run_dir)
        for name, spec in commits.trackers.items():  # on in the run, never recorded by its delivery process
            state.sinks.setdefault(name, SinkState(spec))
        todo = {name: s.spec for name, s in state.sinks.items()
                if s.spec.kind != "null" and (s.cursor < commits.committed or not s.uploaded)}
        worker = worker_for(run_dir, state, todo, commits.committed, Scrubber(env_secrets()), retry_interval=1.0)
        worker.start()
        report = worker.finish([Path(p) for p in commits.artifacts], timeout=timeout)
    return report.undelivered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="miles replay-spool", description=__doc__)
    parser.add_argument("run_dir", type=Path, help="the run directory (holds metrics.jsonl and tracking/)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to keep retrying a failed tracker")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        undelivered = replay(args.run_dir, args.timeout)
    except (FileNotFoundError, DeliveryBusy) as exc:
        print(f"miles replay-spool: error: {exc}")
        return 2
    if undelivered:
        print("still spooled: " + ", ".join(f"{name} {n} lines" for name, n in undelivered.items()))
        return 1
    print(f"replay-spool: every tracker of {args.run_dir} holds all {TrackingState.load(args.run_dir).committed} "
          f"committed lines")
    return 0
