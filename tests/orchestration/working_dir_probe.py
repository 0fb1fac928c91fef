"""A Ray job's driver for test_launch_paths.py::test_the_working_dir_is_not_replaced_under_a_job_after_connect:
joins the job's cluster with miles' `connect`, then
places a task on every other node (as a run places its engines and training ranks) and reports, as one
JSON line, whether the uploaded working dir it runs in was replaced under it and whether a child started
there (a service, `python -m miles...`) still imports miles.serving.parent_watch."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from miles.cluster.connect import connect


@ray.remote(num_cpus=0)
def node_id() -> str:
    return ray.get_runtime_context().get_node_id()


def main() -> None:
    path = os.getcwd()
    connect(None)  # RAY_ADDRESS: the job's cluster
    before = os.stat(path).st_ino
    here = ray.get_runtime_context().get_node_id()
    others = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != here]
    placed = ray.get([node_id.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
                      for n in others])
    child = subprocess.run([sys.executable, "-c", "import miles.serving.parent_watch"], cwd=path,
                           capture_output=True, text=True)
    print("PROBE " + json.dumps({
        "other_nodes": len(others), "placed": placed == others,
        "replaced_after_connect": os.stat(path).st_ino != before,
        "cwd_live": os.path.exists(path) and os.stat(".").st_ino == os.stat(path).st_ino,
        "child_import": child.returncode == 0, "child_stderr": child.stderr[-500:]}), flush=True)


if __name__ == "__main__":
    main()
