"""Tracker delivery in its own low-priority process, so wandb, MLflow and TensorBoard never take
the training process's GIL or its CPU time ahead of training.

The training process (`DeliveryProcess`) starts `python -m miles.tracking.delivery_process`
(a fresh interpreter, not a fork: the trainer has torch threads, Ray and wandb state) with
its environment, and talks to it over two pipes, JSON lines each way:

- the child's stdin, training -> delivery: `start` (tracker specs, the secrets to scrub and
  `--wandb-key`, never on the command line), `commit` (the journal's first N lines are
  committed) and `finish` (the files to upload, how long to retry a failed tracker). EOF
  without `finish` means the training process is gone: the child stops after the delivery
  in progress and exits by itself;
- a dedicated report pipe, delivery -> training: `opened` (a tracker run is open, with its
  run id, for `checkpoint_extra`), `log` (the child's `miles.tracking` warnings, re-logged
  by the training process) and `finished` (what is still spooled). The child's stdout goes
  to stderr, so nothing it prints lands among the trainer's stdout rows.

The child runs at nice 19 under SCHED_IDLE and follows `RUN_DIR/metrics.jsonl` from disk
like `miles replay-spool` does; it alone writes `RUN_DIR/tracking/delivery.json` (the
cursors), holding `RUN_DIR/tracking/delivery.lock` while it does (a resumed run's child
waits there for the killed run's child to leave). Nothing depends on the main thread or on signal handlers, so
this works the same in a Ray worker. If the child dies, training goes on: the error is
logged once and the committed lines stay spooled for the next run or `miles replay-spool`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, BinaryIO

from miles.tracking.delivery import FinishReport, warn_spooled
from miles.tracking.sinks.base import SinkSpec
from miles.tracking.state import DELIVERY_LOCK_PATH, DeliveryState, TrackingState, try_delivery_lock

log = logging.getLogger("miles.tracking")
NICENESS = 19  # the lowest nice value: the kernel runs training first (see lower_priority)
CLOSE_GRACE_S = 60.0  # past the retry timeout, for the final uploads and finishing the tracker runs
EXIT_WAIT_S = 10.0  # for the child to exit once it has reported, before it is killed
ABANDON_GRACE_S = 5.0  # the training process is gone: how long the delivery in progress may take
LOCK_WAIT_S = 120.0  # a previous delivery process of this run dir still leaving


class DeliveryProcessError(RuntimeError):
    pass


# -- the training process's side ------------------------------------------------------------------
class DeliveryProcess:
    """The training process's handle on its delivery process."""

    def __init__(self, run_dir: Path, specs: dict[str, SinkSpec], *, committed: int, retry_interval: float,
                 secrets: tuple[str, ...], secret_options: dict[str, dict[str, Any]]):
        self.run_dir = Path(run_dir).resolve()
        self.specs = dict(specs)  # run ids filled in as the child opens each tracker
        self.opened: set[str] = set()
        self.report: FinishReport | None = None
        self.exited = threading.Event()  # the report pipe is closed: the child is gone (or going)
        self.closing = False
        self.stopped = False  # killed by finish() itself (already reported there)
        read_fd, write_fd = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "miles.tracking.delivery_process", "--run-dir", str(self.run_dir),
                 "--report-fd", str(write_fd)],
                stdin=subprocess.PIPE, stdout=_stderr_or_devnull(), pass_fds=(write_fd,), env=child_env(),
                bufsize=0)
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        self.stdin_fd = self.proc.stdin.fileno()
        start = {"op": "start", "sinks": {name: dataclasses.asdict(s) for name, s in specs.items()},
                 "committed": committed, "retry_interval": retry_interval, "secrets": list(secrets),
                 "secret_options": secret_options, "log_level": log.getEffectiveLevel()}
        try:
            os.write(self.stdin_fd, (json.dumps(start) + "\n").encode())  # fits the empty pipe
        except OSError:
            pass  # it died at once; the reader below reports it
        # from here on the training thread never blocks on the child: a full pipe drops a commit
        # (the next one, or the finish, carries the newer count)
        os.set_blocking(self.stdin_fd, False)
        self.reader = threading.Thread(target=self._read_reports, args=(read_fd,), daemon=True,
                                       name="miles-tracking-reports")
        self.reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def commit(self, committed: int) -> None:
        self._send({"op": "commit", "committed": committed})

    def wait_open(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not set(self.specs) <= self.opened:
            if self.exited.is_set():
                raise DeliveryProcessError(f"the tracking delivery process exited ({self._exit_text()}) before "
                                           f"every tracker run was open")
            if time.monotonic() > deadline:
                raise TimeoutError(f"trackers not open after {timeout}s: {sorted(set(self.specs) - self.opened)}")
            time.sleep(0.05)  # poll interval, bounded by the deadline

    def finish(self, files: list[Path], timeout: float, committed: int, final: bool = True) -> FinishReport:
        """Hand over the final files and wait for the child to deliver, upload and finish (up to
        `timeout` to retry a failed tracker, plus CLOSE_GRACE_S); then reap it. A child that does
        not report in time is killed; what it did not deliver stays spooled."""
        self.closing = True
        deadline = time.monotonic() + timeout + CLOSE_GRACE_S
        message = {"op": "finish", "committed": committed, "files": [str(f) for f in files], "timeout": timeout,
                   "final": final}
        data = (json.dumps(message) + "\n").encode()
        while data and self.stdin_fd >= 0 and not self.exited.is_set() and time.monotonic() < deadline:
            try:
                data = data[os.write(self.stdin_fd, data):]  # longer than PIPE_BUF: may go in parts
            except BlockingIOError:
                time.sleep(0.05)  # the pipe is full: the child is behind on commits
            except OSError:
                break  # the child is gone; its reader reports that once
        self._close_stdin()  # EOF after the finish (a torn one is dropped by the child as abandoned)
        self.exited.wait(max(0.0, deadline - time.monotonic()))
        if self.report is None and not self.exited.is_set():
            log.warning("tracking: the delivery process did not finish within %.0fs; stopping it (what it did "
                        "not deliver stays spooled for `miles replay-spool %s`)", timeout + CLOSE_GRACE_S,
                        self.run_dir)
            self.stopped = True
            self.proc.kill()
        self._reap()
        return self.report if self.report is not None else spooled(self.run_dir, list(self.specs), committed)

    def _send(self, message: dict) -> bool:
        """One short message (under PIPE_BUF, so written whole or not at all), never blocking."""
        if self.stdin_fd < 0:
            return False
        try:
            os.write(self.stdin_fd, (json.dumps(message) + "\n").encode())
            return True
        except OSError:  # a full pipe (BlockingIOError), or the child is gone (its reader reports that once)
            return False

    def _close_stdin(self) -> None:
        if self.stdin_fd >= 0:
            self.stdin_fd = -1
            self.proc.stdin.close()

    def _reap(self) -> None:
        try:
            self.proc.wait(timeout=EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._close_stdin()
        self.reader.join(timeout=EXIT_WAIT_S)

    def _exit_text(self) -> str:
        code = self.proc.poll()
        if code is None:
            return "still running"
        return f"killed by signal {-code}" if code < 0 else f"exit code {code}"

    def _read_reports(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as f:
            for raw in f:
                try:
                    message = json.loads(raw)
                except ValueError:
                    continue
                op = message.get("op")
                if op == "opened":
                    self.specs[message["name"]] = SinkSpec(**message["spec"])
                    self.opened.add(message["name"])
                elif op == "log":
                    log.log(message["level"], "%s", message["message"])
                elif op == "finished":
                    self.report = FinishReport(message["undelivered"])
        # EOF: the child closed its end, so it has exited or is exiting
        try:
            self.proc.wait(timeout=EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
        if self.report is None and not self.stopped:  # the one report of a delivery process lost
            log.warning("tracking: the delivery process stopped (%s)%s; training goes on, the committed points "
                        "stay spooled in the journal for the next run of this run dir or `miles replay-spool %s`",
                        self._exit_text(), " while finishing" if self.closing else "", self.run_dir)
        self.exited.set()


def spooled(run_dir: Path, names: list[str], committed: int) -> FinishReport:
    """What is still undelivered per tracker by the delivery state on disk (a delivery process
    that did not report), each one logged with how to deliver it."""
    state = TrackingState.load(run_dir)
    undelivered = {name: committed - (state.sinks[name].cursor if name in state.sinks else 0) for name in names}
    report = FinishReport({name: n for name, n in undelivered.items() if n > 0})
    warn_spooled(report.undelivered, run_dir)
    return report


def child_env() -> dict[str, str]:
    """The training process's environment (wandb and MLflow settings, WANDB_API_KEY), with this
    `miles` importable first (the child must run the same code, whatever its working directory)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


def _stderr_or_devnull() -> int:
    try:
        os.fstat(2)
        return 2
    except OSError:
        return subprocess.DEVNULL


# -- the delivery process --------------------------------------------------------------------------
class Reports:
    """The child's end of the report pipe (writes after the parent is gone are dropped)."""

    def __init__(self, stream: BinaryIO):
        self.stream, self.lock = stream, threading.Lock()

    def send(self, message: dict) -> None:
        data = (json.dumps(message) + "\n").encode()
        with self.lock:
            try:
                self.stream.write(data)
            except OSError:
                pass


class ReportHandler(logging.Handler):
    def __init__(self, reports: Reports):
        super().__init__()
        self.reports = reports

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.reports.send({"op": "log", "level": record.levelno, "message": record.getMessage()})
        except Exception:
            self.handleError(record)


def lower_priority() -> None:
    """Nice 19, and on Linux the SCHED_IDLE policy as well: a waking training thread then always
    preempts delivery at once (a nice value alone only weighs the shares), so delivery runs on
    cycles training leaves idle. Inherited by the trackers' own helper processes (wandb-core)."""
    os.nice(NICENESS)
    if hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except OSError:
            pass  # not permitted here (some sandboxes): nice 19 alone


def read_stdin(inbox: queue.Queue, gone: threading.Event) -> None:
    """Messages into `inbox`, then None at EOF. `gone` is set only by an EOF without `finish`
    (the training process died): a short run may finish and close the pipe before this process
    has even taken the lock, and its finish must still be carried out."""
    finished = False
    try:
        for raw in sys.stdin.buffer:
            try:
                message = json.loads(raw)
            except ValueError:
                continue
            finished = finished or message.get("op") == "finish"
            inbox.put(message)
    finally:
        if not finished:
            gone.set()
        inbox.put(None)  # EOF


def acquire_lock(run_dir: Path, gone: threading.Event) -> Any | None:
    """Hold the run dir's delivery lock (the one writer of delivery.json); None when the training
    process left while waiting, or another delivery kept it past LOCK_WAIT_S."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while not gone.is_set():
        lock = try_delivery_lock(run_dir)
        if lock is not None:
            return lock
        if time.monotonic() > deadline:
            log.error("tracking: %s stays locked by another delivery (a `miles replay-spool` of this run "
                      "dir?); this run's points stay spooled", run_dir / DELIVERY_LOCK_PATH)
            break
        time.sleep(0.2)  # poll interval, bounded by the deadline
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m miles.tracking.delivery_process")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--report-fd", type=int, required=True)
    args = parser.parse_args(argv)
    lower_priority()  # before anything heavy is imported
    os.set_inheritable(args.report_fd, False)  # a tracker's helper process must not keep the pipe open
    reports = Reports(os.fdopen(args.report_fd, "wb", buffering=0))
    inbox: queue.Queue = queue.Queue()
    gone = threading.Event()
    threading.Thread(target=read_stdin, args=(inbox, gone), daemon=True, name="miles-tracking-stdin").start()
    start = inbox.get()
    if start is None or start.get("op") != "start":
        return 0
    tracking_log = logging.getLogger("miles.tracking")
    tracking_log.addHandler(ReportHandler(reports))
    tracking_log.setLevel(start.get("log_level", logging.WARNING))
    tracking_log.propagate = False  # the training process logs it, once
    lock = acquire_lock(args.run_dir, gone)
    if lock is None:
        return 0 if gone.is_set() else 3
    try:
        worker = build_worker(args.run_dir, start, reports)
    except Exception:
        from miles.tracking.secrets import Scrubber

        log.error("tracking: the delivery process could not start its trackers: %s",
                  Scrubber(tuple(start["secrets"])).scrub(traceback.format_exc()))
        return 1
    worker.start()
    worker.submit(start["committed"])
    while True:
        message = inbox.get()
        if message is None:  # the training process is gone without finishing: leave promptly
            worker.abandon()
            worker.thread.join(ABANDON_GRACE_S)
            os._exit(0)  # no atexit teardown of tracker runs: resumable, as after a kill
        if message["op"] == "commit":
            worker.submit(message["committed"])
        elif message["op"] == "finish":
            report = worker.finish([Path(p) for p in message["files"]], message["timeout"], message["committed"],
                                   message.get("final", True))
            reports.send({"op": "finished", "undelivered": report.undelivered})
            return 0


def build_worker(run_dir: Path, start: dict, reports: Reports):
    from miles.tracking.delivery import worker_for
    from miles.tracking.secrets import Scrubber

    state = DeliveryState.load(run_dir)
    committed = start["committed"]
    for name, sink_state in state.sinks.items():
        if sink_state.cursor > committed:
            log.warning("tracking: %s already holds %d lines past the checkpoint; the redone rollouts will "
                        "appear twice there", name, sink_state.cursor - committed)
            sink_state.cursor = committed
    specs = {name: SinkSpec(**spec) for name, spec in start["sinks"].items()}
    worker = worker_for(run_dir, state, specs, committed, Scrubber(tuple(start["secrets"])), start["retry_interval"],
                        secret_options=start["secret_options"],
                        on_open=lambda name, spec: reports.send({"op": "opened", "name": name,
                                                                 "spec": dataclasses.asdict(spec)}))
    state.save()
    return worker


if __name__ == "__main__":
    sys.exit(main())
