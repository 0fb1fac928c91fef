"""`miles replay-spool RUN_DIR`: deliver the committed points a tracker missed (an outage that
outlived the run), then store the run's artifacts and finish its tracker runs."""
from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

import yaml

from miles.tracking.delivery import DeliveryWorker
from miles.tracking.journal import Journal
from miles.tracking.run_tracker import CONFIG_ARTIFACT
from miles.tracking.samples import existing_samples
from miles.config.fields import is_secret_name
from miles.tracking.secrets import MIN_SECRET_LEN, Scrubber
from miles.tracking.sinks.base import build_sink
from miles.tracking.state import STATE_PATH, TrackingState


def env_secrets() -> tuple[str, ...]:
    return tuple(v for k, v in os.environ.items() if is_secret_name(k) and len(v) >= MIN_SECRET_LEN)


def replay(run_dir: Path, timeout: float) -> dict[str, int]:
    """Deliver every spooled line; returns what is still undelivered per tracker (empty: all done)."""
    state = TrackingState.load(run_dir)
    if not state.path.exists():
        raise FileNotFoundError(f"{run_dir} has no {STATE_PATH}: not a run directory with trackers")
    config_path = run_dir / CONFIG_ARTIFACT
    params = yaml.safe_load(config_path.read_text()) if config_path.exists() else {}
    todo = {name: s for name, s in state.sinks.items() if s.cursor < state.committed or not s.uploaded}
    sinks = []
    for name, sink_state in todo.items():
        sink = build_sink(sink_state.spec, params)
        sink.name = name
        sinks.append(sink)
    journal = Journal(run_dir)
    worker = DeliveryWorker(sinks, state, journal.lines, lambda rid: existing_samples(run_dir, rid),
                            Scrubber(env_secrets()), retry_interval=1.0)
    worker.start()
    report = worker.finish([Path(p) for p in state.artifacts], timeout=timeout)
    return report.undelivered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="miles replay-spool", description=__doc__)
    parser.add_argument("run_dir", type=Path, help="the run directory (holds metrics.jsonl and tracking/)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to keep retrying a failed tracker")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        undelivered = replay(args.run_dir, args.timeout)
    except FileNotFoundError as exc:
        print(f"miles replay-spool: error: {exc}")
        return 2
    if undelivered:
        print("still spooled: " + ", ".join(f"{name} {n} lines" for name, n in undelivered.items()))
        return 1
    print(f"replay-spool: every tracker of {args.run_dir} holds all {TrackingState.load(args.run_dir).committed} "
          f"committed lines")
    return 0
