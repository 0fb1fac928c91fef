"""A stall inside the Prefect flow: the health watch of the chunk's task writes the diagnose bundle once and
leaves it on the flow run as artifacts (a link to the bundle, the verdict in words)."""
from __future__ import annotations

import re
import threading
import time

import pytest

from tests.diagnose.hang_rewards import HANG_REWARD
from tests.support.runs import bundles

STALL = ["--health-stall-factor", "3", "--health-stall-min-s", "4", "--health-stall-check-interval", "1"]


def hold_rollout_until_bundle(run_dir, hang_file, seen: dict, deadline_s: float = 900.0) -> None:
    """Hold the 4th rollout in its reward (the file exists from the start; the reward holds once rollouts 0-2
    are in the journal, MILES_TEST_HANG_AFTER) until the stall bundle is written, then let the run go on
    (always: a flow left hanging would hang the test)."""
    end = time.monotonic() + deadline_s
    try:
        while not bundles(run_dir) and time.monotonic() < end:
            time.sleep(0.5)  # poll interval; bounded by the deadline
        seen["bundles"] = bundles(run_dir)
    finally:
        hang_file.unlink(missing_ok=True)


@pytest.mark.slow
def test_a_stall_in_the_flow_leaves_the_bundle_as_artifacts(run_grpo, tmp_path, monkeypatch):
    from prefect.artifacts import Artifact

    hang_file = tmp_path / "hang"
    monkeypatch.setenv("MILES_TEST_HANG_FILE", str(hang_file))  # the local Ray cluster's workers inherit it
    monkeypatch.setenv("MILES_TEST_HANG_AFTER", f"{tmp_path / 'run'}:3")
    hang_file.touch()
    seen: dict = {}
    watcher = threading.Thread(target=hold_rollout_until_bundle, args=(tmp_path / "run", hang_file, seen),
                               daemon=True)
    watcher.start()
    state, run_dir = run_grpo("--num-rollout", "6", "--custom-rm-path", HANG_REWARD, *STALL)
    watcher.join(timeout=60)
    assert state.is_completed(), state.message
    (bundle,) = seen["bundles"]
    assert bundles(run_dir) == [bundle]  # written once
    link = Artifact.get("grpo-diagnose-bundle")
    assert link is not None and f"({bundle.resolve().as_uri()})" in link.data, link  # a link to the bundle file
    verdict = Artifact.get("grpo-diagnose").data
    assert re.search(r"stalled in `rollout` of rollout [3-5]", verdict) and bundle.name in verdict, verdict
