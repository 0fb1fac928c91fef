"""A custom reward (`--custom-rm-path tests.diagnose.hang_rewards.reward_waits_while_file_exists`) that
hangs the rollout while the file named by MILES_TEST_HANG_FILE exists: a test makes a run hang in its
reward at the moment it chooses (FILE.waiting exists while a reward is held there), and lets it go on by removing
the file."""
import contextlib
import os
import time
from pathlib import Path

from tests.support.runs import rollouts_done

HANG_REWARD = "tests.diagnose.hang_rewards.reward_waits_while_file_exists"  # the flag's value


def due() -> bool:
    """With MILES_TEST_HANG_AFTER=RUN_DIR:N, a reward holds only once N rollouts are in the run's journal: the
    rollout to hold is chosen by the run itself, not by a test thread that must touch the file in time (under
    load one missed every rollout left)."""
    after = os.environ.get("MILES_TEST_HANG_AFTER")
    if not after:
        return True
    run_dir, count = after.rsplit(":", 1)
    return rollouts_done(Path(run_dir)) >= int(count)


def reward_waits_while_file_exists(args, sample) -> float:
    path = os.environ.get("MILES_TEST_HANG_FILE")
    if path and os.path.exists(path) and due():
        waiting = path + ".waiting"
        open(waiting, "w").close()  # tells the test the rollout is held here now
        while os.path.exists(path):
            time.sleep(0.2)
        with contextlib.suppress(FileNotFoundError):  # let go: held no longer (several samples may wait here)
            os.unlink(waiting)
    return float(str(sample.response).strip() == str(sample.label).strip())
