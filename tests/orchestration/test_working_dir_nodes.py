"""Two Ray nodes on one machine started as docs/user-guide/orchestration.md shows (`ray start --head`, then
`ray start --address`, both in Ray's default temp dir) share one copy of a job's `--working-dir`, and each
node's runtime-env agent deletes and unpacks that copy again the first time a worker there needs it
(Ray's working_dir plugin unpacks with overwrite=True). The first task placed on the second node then
replaced the tree the driver and its services were importing from: the first-hour review's
"ModuleNotFoundError: No module named 'miles.serving.parent_watch'". `connect` now has every node unpack
the copy before it returns."""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.orchestration.ray_head import REPO, start_head

TIMEOUT_S = 300


@pytest.mark.slow
def test_the_working_dir_is_not_replaced_under_a_job_after_connect():
    head = start_head(num_cpus=1)
    try:
        head.join_node(num_cpus=1, share_temp_dir=True)
        assert head.alive_nodes() == 2
        env = {**head.cli_env(), "PYTHONPATH": ""}  # only the uploaded copy, as on a clean clone's nodes
        proc = subprocess.run(["ray", "job", "submit", f"--address={head.dashboard}", "--working-dir", ".", "--",
                               "python", "-m", "tests.orchestration.working_dir_probe"],
                              env=env, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
        assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
        probe = json.loads(lines[-1].removeprefix("PROBE "))
        assert probe["other_nodes"] == 1 and probe["placed"]
        assert not probe["replaced_after_connect"], probe
        assert probe["cwd_live"], probe
        assert probe["child_import"], probe
    finally:
        head.stop()
