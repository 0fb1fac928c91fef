"""A custom reward (`--custom-rm-path tests.diagnose.hang_rewards.reward_waits_while_file_exists`) that
hangs the rollout while the file named by MILES_TEST_HANG_FILE exists: a test makes a run hang in its
reward at the moment it chooses (it writes FILE.waiting once held), and lets it go on by removing the file."""
import os
import time

HANG_REWARD = "tests.diagnose.hang_rewards.reward_waits_while_file_exists"  # the flag's value


def reward_waits_while_file_exists(args, sample) -> float:
    path = os.environ.get("MILES_TEST_HANG_FILE")
    if path and os.path.exists(path):
        open(path + ".waiting", "w").close()  # tells the test the rollout is held here now
    while path and os.path.exists(path):
        time.sleep(0.2)
    return float(str(sample.response).strip() == str(sample.label).strip())
