"""A custom reward (`--custom-rm-path tests.diagnose.hang_rewards.reward_waits_while_file_exists`) that
hangs the rollout while the file named by MILES_TEST_HANG_FILE exists: a test makes a run hang in its
reward at the moment it chooses (FILE.waiting exists while a reward is held there), and lets it go on by removing
the file."""
import contextlib
import os
import time

HANG_REWARD = "tests.diagnose.hang_rewards.reward_waits_while_file_exists"  # the flag's value


def reward_waits_while_file_exists(args, sample) -> float:
    path = os.environ.get("MILES_TEST_HANG_FILE")
    if path and os.path.exists(path):
        waiting = path + ".waiting"
        open(waiting, "w").close()  # tells the test the rollout is held here now
        while os.path.exists(path):
            time.sleep(0.2)
        with contextlib.suppress(FileNotFoundError):  # let go: held no longer (several samples may wait here)
            os.unlink(waiting)
    return float(str(sample.response).strip() == str(sample.label).strip())
