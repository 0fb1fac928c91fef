"""Issue 55: `miles diagnose` on a live run that has not finished a rollout, and on a live run whose
tracker delivery is behind. Run dirs built by hand; the "trainer" and the "delivery process" are
child Python processes that take the run's own flock (as RunDirLock and the delivery process do)
and sleep.

- N22: a trainer holding RUN_DIR/.lock, alive, before it listed its processes or wrote a rollout,
  was "VERDICT (dead): the trainer died before any rollout without closing" 8, 38 and 57 s into a
  run.
- N27: a tracker behind while its delivery process is alive and catching up was told to run `miles
  replay-spool`; that advice is for a delivery process that is gone.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from miles.diagnose.bundle import collect
from miles.diagnose.lock_holders import lock_holder
from miles.record import layout
from miles.tracking.sinks.base import SinkSpec
from miles.tracking.state import DeliveryState, SinkState, TrainerFile

HOLD = textwrap.dedent("""
    import fcntl, sys, time
    f = open(sys.argv[1], "a")
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("locked", flush=True)
    time.sleep(600)
""")


@pytest.fixture
def hold():
    """hold(path) -> a child process holding an flock on `path` (ended after the test)."""
    children = []

    def start(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        child = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE,
                                 text=True)
        children.append(child)
        assert child.stdout.readline().strip() == "locked"  # readiness: the lock is taken
        return child

    yield start
    for child in children:
        child.kill()
        child.wait()


def starting_run(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / layout.LOCK).touch()
    return run_dir


def test_a_live_trainer_before_its_first_rollout_is_starting_not_dead(tmp_path, hold):
    run_dir = starting_run(tmp_path)
    trainer = hold(run_dir / layout.LOCK)
    assert lock_holder(run_dir / layout.LOCK) == trainer.pid
    verdict = collect(run_dir).verdict
    assert verdict["status"] == "starting", verdict
    assert "died" not in verdict["headline"] and "starting" in verdict["headline"]
    assert any(f"pid {trainer.pid}" in line for line in verdict["details"])


def test_the_same_run_dir_after_the_trainer_died_is_dead(tmp_path, hold):
    run_dir = starting_run(tmp_path)
    trainer = hold(run_dir / layout.LOCK)
    trainer.kill()
    trainer.wait()  # the kernel dropped its lock: .lock still names nobody alive
    assert lock_holder(run_dir / layout.LOCK) is None
    verdict = collect(run_dir).verdict
    assert verdict["status"] == "dead" and "before any rollout" in verdict["headline"]


def behind_run(tmp_path):
    """A closed run (no live trainer) whose journal has 3 lines, of which wandb holds 1."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rows = [{"rollout_id": i, "time": 1.0 + i, "rollout/raw_reward": 0.5} for i in range(3)]
    (run_dir / layout.JOURNAL).write_text("".join(json.dumps(r) + "\n" for r in rows))
    TrainerFile(run_dir / layout.TRAINER_STATE, close={"session": "s", "final": True}).save()
    behind = {"wandb": SinkState(SinkSpec("wandb", {}), cursor=1)}
    DeliveryState(run_dir / layout.DELIVERY_STATE, behind).save()
    return run_dir


def tracker_line(verdict):
    return next(line for line in verdict["details"] if line.startswith("tracker wandb"))


def test_a_tracker_catching_up_is_not_told_to_replay_the_spool(tmp_path, hold):
    run_dir = behind_run(tmp_path)
    delivery = hold(run_dir / layout.DELIVERY_LOCK)
    line = tracker_line(collect(run_dir).verdict)
    assert "2 journal lines behind" in line and "replay-spool" not in line
    assert f"delivery process {delivery.pid} is catching up" in line
    delivery.kill()
    delivery.wait()
    line = tracker_line(collect(run_dir).verdict)  # gone: the spool is the user's to replay
    assert "no delivery process running" in line and "`miles replay-spool`" in line
