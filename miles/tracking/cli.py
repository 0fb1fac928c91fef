"""`miles replay-spool RUN_DIR [--follow]`: the one delivery program. Without `--follow` it
delivers the journal lines a tracker missed (an outage that outlived the run), stores the
run's artifacts and finishes its tracker runs. With `--follow` it is a run's delivery process
(the trainer starts it when a tracker is on): it delivers each line within seconds of its record,
finishes as the trainer's close asks, and leaves when the trainer is gone."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from miles.config.fields import is_secret_name
from miles.tracking.delivery import POLL_S, DeliveryLoop
from miles.tracking.secrets import MIN_SECRET_LEN, Scrubber
from miles.tracking.sinks.base import SINK_CLASSES, build_sink
from miles.tracking.state import (DELIVERY_LOCK_PATH, DELIVERY_LOG_PATH, TRAINER_PATH, DeliveryState, TrainerFile,
                                  is_run_dir, recorded_lines, try_delivery_lock)

log = logging.getLogger("miles.tracking")
SECRETS_ENV = "MILES_TRACKING_SCRUB_SECRETS"  # flag secrets the trainer hands over to scrub (a JSON list)
NICENESS = 10  # once the trackers are open: a small share of a busy CPU, never none (see `follow`)
LOCK_WAIT_S = 120.0  # for a previous delivery process of this run dir to leave


class DeliveryBusy(RuntimeError):
    pass


def env_scrubber() -> Scrubber:
    found = {v for k, v in os.environ.items() if is_secret_name(k)} | set(json.loads(os.environ.get(SECRETS_ENV, "[]")))
    return Scrubber(tuple(sorted((v for v in found if len(v) >= MIN_SECRET_LEN), key=len, reverse=True)))


class ScrubbingFormatter(logging.Formatter):
    def __init__(self, scrubber: Scrubber):
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.scrubber = scrubber

    def format(self, record: logging.LogRecord) -> str:
        return self.scrubber.scrub(super().format(record))


def acquire_lock(run_dir: Path, wait_s: float):
    """The run dir's delivery lock (the one writer of delivery.json), waiting up to `wait_s`."""
    deadline = time.monotonic() + wait_s
    while (lock := try_delivery_lock(run_dir)) is None:
        if time.monotonic() >= deadline:
            raise DeliveryBusy(f"{run_dir / DELIVERY_LOCK_PATH} is held: another delivery process of this run dir "
                               f"(the run's own, or a `miles replay-spool`) is still running")
        time.sleep(0.2)  # poll interval of the wait, bounded by the deadline
    return lock


def replay(run_dir: Path, timeout: float, retry_interval: float = 1.0) -> dict[str, int]:
    """Deliver every spooled line, upload the artifacts, finish the tracker runs; returns what is
    still undelivered per tracker (empty: all done)."""
    if not is_run_dir(run_dir):
        raise FileNotFoundError(f"{run_dir} has no {TRAINER_PATH}: not a run directory")
    with acquire_lock(run_dir, 0.0):
        trainer, sinks = TrainerFile.load(run_dir), DeliveryState.load(run_dir).sinks
        # the delivery state's spec has the run id its tracker opened; one never opened, the trainer's
        specs = {**trainer.trackers, **{name: s.spec for name, s in sinks.items()}}
        todo = {name: spec for name, spec in specs.items() if spec.kind in SINK_CLASSES and
                (name not in sinks or sinks[name].cursor < recorded_lines(run_dir) or not sinks[name].uploaded)}
        return DeliveryLoop(run_dir, todo, env_scrubber(), retry_interval).finish(
            [Path(p) for p in trainer.artifacts], timeout)


def follow(run_dir: Path, session: str | None, retry_interval: float) -> tuple[str, dict[str, int]]:
    """Deliver the run's journal live; at the trainer's close finish as it asks ("closed"); when
    the trainer is gone leave the tracker runs open for its resume ("gone")."""
    with acquire_lock(run_dir, LOCK_WAIT_S):
        trainer = TrainerFile.load(run_dir)
        session = session or (trainer.trainer or {}).get("session")
        # While the trainer reads its checkpoint: import the trackers, create the MLflow store
        for name, spec in trainer.trackers.items():
            try:
                build_sink(spec, {}).prepare()
            except Exception as exc:  # its open will fail and report it
                log.info("tracking: preparing %s failed: %s", name, env_scrubber().scrub(str(exc)))
        waiting = DeliveryLoop(run_dir, {}, env_scrubber(), retry_interval, session)
        while (status := waiting.trainer_state()) == "starting":
            time.sleep(POLL_S)  # the poll interval, until the trainer opens the tracker
            waiting.refresh()
        if status == "gone" or not (waiting.trainer_file.trainer or {}).get("open"):
            return status, {}  # gone, or closed before it opened: nothing to open here
        loop = DeliveryLoop(run_dir, waiting.trainer_file.trackers, env_scrubber(), retry_interval, session)
        loop.catch_up_all()  # opens every tracker, at the trainer's priority
        # Then nice 10: against one busy training thread per core the kernel still gives delivery
        # about a tenth of a core (SCHED_IDLE, used before, gave it none until training paused, so
        # points arrived at the end of the run); its work per line is milliseconds.
        os.nice(max(0, NICENESS - os.nice(0)))
        status = loop.follow()
        if status == "gone":
            return status, loop.pending()
        close = loop.trainer_file.close
        return status, loop.finish([Path(p) for p in loop.trainer_file.artifacts], close["timeout"], close["final"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="miles replay-spool", description=__doc__)
    parser.add_argument("run_dir", type=Path, help="the run directory (holds metrics.jsonl and tracking/)")
    parser.add_argument("--follow", action="store_true",
                        help="deliver lines as they are recorded until the run's trainer closes or is gone")
    parser.add_argument("--session", help="with --follow: the trainer session to follow (default: the current one)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to keep retrying a failed tracker")
    parser.add_argument("--retry-interval", type=float, default=1.0, help="seconds between tries of a failed tracker")
    args = parser.parse_args(argv)
    for flag, value in (("--timeout", args.timeout), ("--retry-interval", args.retry_interval)):
        if value < 0:
            parser.error(f"{flag} must be >= 0, got {value}")
    run_dir = args.run_dir.resolve()
    if not is_run_dir(run_dir):
        print(f"miles replay-spool: error: {run_dir} has no {TRAINER_PATH}: not a run directory", file=sys.stderr)
        return 2
    # everything logged (ours, wandb's, MLflow's) goes to RUN_DIR/tracking/delivery.log, scrubbed
    handlers = [logging.FileHandler(run_dir / DELIVERY_LOG_PATH)] + ([] if args.follow else [logging.StreamHandler()])
    for handler in handlers:
        handler.setFormatter(ScrubbingFormatter(env_scrubber()))
        logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.WARNING)
    log.setLevel(logging.INFO)
    try:
        if args.follow:
            status, undelivered = follow(run_dir, args.session, args.retry_interval)
        else:
            status, undelivered = "replayed", replay(run_dir, args.timeout, args.retry_interval)
    except DeliveryBusy as exc:
        print(f"miles replay-spool: error: {exc}", file=sys.stderr)
        return 2
    except Exception:
        log.exception("tracking: delivery stopped")
        return 3
    for name, count in undelivered.items():
        log.warning("tracking: %d journal lines for %s are still spooled; deliver them with "
                    "`miles replay-spool %s`", count, name, run_dir)
    recorded = recorded_lines(run_dir)
    print(f"replay-spool: {status}; " + (", ".join(f"{n} {c} lines still spooled" for n, c in undelivered.items())
                                         or f"every tracker of {run_dir} holds all {recorded} journal lines"),
          flush=True)
    if status == "gone":
        logging.shutdown()
        os._exit(0)  # no atexit teardown of tracker runs: they stay resumable, as after a kill
    return 1 if undelivered and not args.follow else 0


if __name__ == "__main__":
    sys.exit(main())
