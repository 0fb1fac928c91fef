"""Tracker delivery runs in its own process (`miles replay-spool RUN_DIR --follow`, nice 10 once its
trackers are open): never the training process, reaped by close(), nothing of it on the trainer's
stdout, its output in RUN_DIR/tracking/delivery.log; it leaves by itself when the training process is
SIGKILLed; when it dies itself, training goes on, the error is reported once and the committed
points stay spooled for the next run; and all of it works from inside a Ray worker."""
from __future__ import annotations

import logging
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from synthetic import iterate
from tracking_helpers import assert_points_equal, charted, journal_points, mlflow_points, run_synthetic

from miles.config import parse_config
from miles.record.journal import read_journal
from miles.tracking import open_tracking
from miles.tracking.delivery import NICENESS, replay
from miles.tracking.state import DeliveryState, recorded_lines

DEADLINE_S = 120.0
FLAG_SECRET = "flagtok-0ddba11c0ffee"


def process_state(pid: int) -> str | None:
    """The /proc state letter of `pid` (R, S, Z, ...), None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while process_state(pid) not in (None, "Z", "X"):  # a zombie has exited (its parent reaps it)
        assert time.monotonic() < deadline, f"process {pid} still running after {timeout}s"
        time.sleep(0.1)  # poll interval


def wait_delivered(run_dir: Path, lines: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while (sink := DeliveryState.load(run_dir).sinks.get("mlflow")) is None or sink.cursor < lines:
        assert time.monotonic() < deadline, f"mlflow never got {lines} lines"
        time.sleep(0.1)  # poll interval


def lowered_nice(pid: int) -> int:
    """The delivery process's nice value once it lowered it (right after its trackers opened)."""
    deadline = time.monotonic() + DEADLINE_S
    while (nice := os.getpriority(os.PRIO_PROCESS, pid)) < NICENESS:
        assert time.monotonic() < deadline, "the delivery process never lowered its priority"
        time.sleep(0.05)  # poll interval
    return nice


def test_delivery_runs_niced_in_its_own_process_and_close_reaps_it(run_dir, capfd):
    config = parse_config(["--num-rollout", "4", "--use-mlflow", "--router-admin-token", FLAG_SECRET])
    tracker = open_tracking(config, run_dir)
    tracker.open({})
    tracker.wait_open(DEADLINE_S)
    pid = tracker.delivery.pid
    assert pid != os.getpid() and process_state(pid) in ("R", "S", "D")
    assert lowered_nice(pid) == NICENESS
    assert os.sched_getscheduler(pid) == os.SCHED_OTHER  # a share of a busy CPU, not SCHED_IDLE's none
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[1:5] == [b"-m", b"miles.tracking.cli", str(run_dir.resolve()).encode(), b"--follow"]
    assert not any(FLAG_SECRET.encode() in arg for arg in cmdline)
    iterate(tracker, config, range(4))
    assert tracker.close() == {}
    assert process_state(pid) is None  # exited and reaped: no zombie
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    out, _ = capfd.readouterr()
    rows = out.splitlines()
    assert len(rows) == 4 * 3 and all(re.match(r"(\[trainer\] iter \d+ \(\d+/4\) | +)\| ", r) for r in rows), out
    want = journal_points(run_dir)
    assert_points_equal("mlflow", mlflow_points(run_dir, want), charted(want))
    assert "mlflow open" in (run_dir / "tracking" / "delivery.log").read_text()


def test_delivery_process_killed_training_goes_on_and_next_run_delivers(run_dir, caplog):
    config = parse_config(["--num-rollout", "8", "--use-mlflow", "--tracking-retry-interval", "0.5"])
    tracker = open_tracking(config, run_dir)
    tracker.open({})
    with caplog.at_level(logging.WARNING, logger="miles.tracking"):
        iterate(tracker, config, range(0, 3))
        wait_delivered(run_dir, 3)
        pid = tracker.delivery.pid
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid, DEADLINE_S)
        iterate(tracker, config, range(3, 6))  # training goes on, rows and journal as before
        deadline = time.monotonic() + DEADLINE_S
        # a killed process's last threads (MLflow's system-metrics sampler in a disk write) may
        # outlive its zombie leader for a moment: the next records notice it once it is reaped
        while not any("delivery process stopped" in r.message for r in caplog.records):
            assert time.monotonic() < deadline, [r.message for r in caplog.records]
            time.sleep(0.1)  # poll interval
            tracker.delivery.check()  # what each record does
        extra = tracker.checkpoint_extra()
        assert tracker.close() == {"mlflow": 3}  # spooled, not lost
    stops = [r for r in caplog.records if "delivery process stopped" in r.message]
    assert len(stops) == 1 and "killed by signal 9" in stops[0].message, [r.message for r in stops]
    assert process_state(pid) is None
    assert [ln.rollout_id for ln in read_journal(run_dir / "metrics.jsonl")] == list(range(6))

    again = open_tracking(config, run_dir)  # the next run of this run dir, resumed at its checkpoint
    again.open(extra)
    assert again.close() == {}
    state = DeliveryState.load(run_dir)
    assert state.sinks["mlflow"].cursor == 6 and state.sinks["mlflow"].spec.options["run_id"] == extra["mlflow_run_id"]
    want = journal_points(run_dir)
    assert_points_equal("mlflow", mlflow_points(run_dir, want), charted(want))


def test_training_process_sigkilled_delivery_process_leaves_by_itself(run_dir):
    # checkpoints at rollout 1, records rollout 2, SIGKILLs itself
    proc = run_synthetic(run_dir, "--rollouts", "5", "--save-interval", "2", "--use-mlflow", "--kill-at", "2",
                         "--wait-trackers-open", check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pid = int(re.search(r"delivery_pid=(\d+)", proc.stdout).group(1))
    wait_gone(pid, 30.0)  # pipe EOF: no orphan left delivering
    assert recorded_lines(run_dir) == 3
    assert replay(run_dir, timeout=60.0) == {}  # every recorded line still reaches the tracker
    want = journal_points(run_dir)
    assert_points_equal("mlflow", mlflow_points(run_dir, want), charted(want))


def deliver_in_ray_worker(run_dir: str) -> dict:
    """Runs as a Ray task: the trainer's situation in the Prefect flow (not the main process of a
    script, no signal handlers of ours)."""
    import os

    from miles.config import parse_config
    from miles.tracking import open_tracking

    config = parse_config(["--num-rollout", "3", "--use-mlflow"])
    tracker = open_tracking(config, Path(run_dir))
    tracker.open({})
    tracker.wait_open(120.0)
    pid = tracker.delivery.pid
    nice = lowered_nice(pid)
    for rollout_id in range(3):
        tracker.record(rollout_id, {"train/loss": 1.0 / (rollout_id + 1), "rollout/step": float(rollout_id),
                                    "train/step": float(rollout_id)})
    report = tracker.close()
    return {"undelivered": report, "pid": pid, "worker_pid": os.getpid(), "nice": nice,
            "reaped": not Path(f"/proc/{pid}").exists()}


@pytest.mark.slow
def test_delivery_process_from_a_ray_worker(run_dir, ray_cluster):
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the worker cannot import this test module
    try:
        result = ray.get(ray.remote(num_cpus=0)(deliver_in_ray_worker).remote(str(run_dir)), timeout=300)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert result["undelivered"] == {} and result["reaped"], result
    assert result["pid"] not in (os.getpid(), result["worker_pid"]) and result["nice"] >= NICENESS
    want = journal_points(run_dir)
    assert_points_equal("mlflow", mlflow_points(run_dir, want), charted(want))


@pytest.mark.parametrize("executable, message", [("/nonexistent/python", "cannot start the delivery process"),
                                                 ("/bin/false", "delivery process stopped (exit code 1)")])
def test_delivery_process_that_never_ran_leaves_everything_to_replay(run_dir, caplog, monkeypatch, executable,
                                                                     message):
    monkeypatch.setattr(sys, "executable", executable)
    config = parse_config(["--num-rollout", "3", "--use-mlflow"])
    tracker = open_tracking(config, run_dir)
    tracker.open({})
    with caplog.at_level(logging.WARNING, logger="miles.tracking"):
        iterate(tracker, config, range(3))  # training goes on
        assert tracker.close() == {"mlflow": 3}
    assert len([r for r in caplog.records if message in r.message]) == 1, [r.message for r in caplog.records]
    monkeypatch.undo()
    assert replay(run_dir, timeout=60.0) == {}  # the run's trackers are known without the delivery state
    want = journal_points(run_dir)
    assert_points_equal("mlflow", mlflow_points(run_dir, want), charted(want))
