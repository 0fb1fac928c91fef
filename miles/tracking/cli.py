"""`miles replay-spool RUN_DIR [--follow]`: without `--follow`, deliver the journal lines a tracker
missed (an outage that outlived the run), store the run's artifacts and finish its tracker runs.
With `--follow` it is a run's delivery process (the trainer starts it when a tracker is on): it
delivers each line within seconds of its record, finishes as the trainer's close asks, and
leaves when the trainer is gone."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from miles.config.secrets import Scrubber, env_scrubber
from miles.tracking.delivery import DeliveryBusy, follow, replay
from miles.tracking.state import DELIVERY_LOG_PATH, TRAINER_PATH, StateError, is_run_dir, log_spooled, recorded_lines

log = logging.getLogger("miles.tracking")


class ScrubbingFormatter(logging.Formatter):
    def __init__(self, scrubber: Scrubber):
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.scrubber = scrubber

    def format(self, record: logging.LogRecord) -> str:
        return self.scrubber.scrub(super().format(record))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="miles replay-spool", description=__doc__)
    parser.add_argument("run_dir", type=Path, help="the run directory (holds metrics.jsonl and tracking/)")
    parser.add_argument("--follow", action="store_true",
                        help="deliver lines as they are recorded until the run's trainer closes or is gone")
    parser.add_argument("--session", help="with --follow: the trainer session to follow (default: the current one)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to keep retrying a failed tracker")
    parser.add_argument("--retry-interval", type=float, default=1.0, help="seconds between tries of a failed tracker")
    parser.add_argument("--allow-dir", type=Path, action="append", default=[], metavar="DIR",
                        help="without --follow: let a tracker write under DIR too (a run started with "
                             "--tensorboard-dir, --wandb-dir or a local MLflow store outside its run dir); "
                             "otherwise replay-spool writes only inside RUN_DIR")
    parser.add_argument("--mlflow-tracking-uri", metavar="URI", default=None,
                        help="without --follow: the remote MLflow server to deliver to (default: "
                             "MLFLOW_TRACKING_URI); a server the run's state files name is used only when it is "
                             "this one, so MLflow credentials go to no other")
    args = parser.parse_args(argv)
    for flag, value in (("--timeout", args.timeout), ("--retry-interval", args.retry_interval)):
        if value < 0:
            parser.error(f"{flag} must be >= 0, got {value}")
    run_dir = args.run_dir.resolve()
    if not is_run_dir(run_dir):
        print(f"miles replay-spool: error: {run_dir} has no {TRAINER_PATH}: not a run directory", file=sys.stderr)
        return 2
    # everything logged (ours, wandb's, MLflow's) goes to RUN_DIR/tracking/delivery.log, scrubbed
    scrubber = env_scrubber()
    for handler in [logging.FileHandler(run_dir / DELIVERY_LOG_PATH)] + ([] if args.follow else [logging.StreamHandler()]):
        handler.setFormatter(ScrubbingFormatter(scrubber))
        logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.WARNING)
    log.setLevel(logging.INFO)
    try:
        if args.follow:
            status, undelivered = follow(run_dir, args.session, scrubber, args.retry_interval)
        else:
            trusted = args.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None
            status, undelivered = "replayed", replay(run_dir, args.timeout, args.retry_interval, scrubber,
                                                  args.allow_dir, trusted)
    except (DeliveryBusy, StateError) as exc:
        print(f"miles replay-spool: error: {exc}", file=sys.stderr)
        return 2
    except Exception:
        log.exception("tracking: delivery stopped")
        return 3
    log_spooled(run_dir, undelivered)
    print(f"replay-spool: {status}; " + (", ".join(f"{n} {c} lines still spooled" for n, c in undelivered.items())
                                         or f"every tracker of {run_dir} holds all {recorded_lines(run_dir)} journal lines"),
          flush=True)
    if status == "gone":
        logging.shutdown()
        os._exit(0)  # no atexit teardown of tracker runs: they stay resumable, as after a kill
    return 1 if undelivered and not args.follow else 0


if __name__ == "__main__":
    sys.exit(main())
