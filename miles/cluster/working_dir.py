"""Have every node of a Ray job's cluster unpack the job's `--working-dir` before the run places anything.

Ray's working_dir plugin unpacks a job's uploaded copy into RAY_TEMP_DIR/session_*/runtime_resources on
each node, deleting and unpacking it again the first time a worker on that node needs it (it unpacks with
overwrite=True). Two nodes on one machine started with the same temp dir (Ray's default /tmp/ray, as
`ray start --head` then `ray start --address` gives) share that folder, so the first task or actor placed
on the second node replaced the tree the driver and the services it started were running from: a service
starting then failed with "No module named 'miles.serving.parent_watch'" (the package found, the module
not yet unpacked again), and the driver's working directory was a deleted folder. One no-op task per
node, while the driver waits and imports nothing, moves every such replacement to before the run starts;
each node then keeps its copy for the rest of the job. A node that joins later still unpacks on first use:
on one machine, start each further node with its own `--temp-dir`.
"""
from __future__ import annotations

import logging
import os

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

UNPACK_TIMEOUT_S = 600.0  # a large working dir on a busy node; it is what the run's first task would wait anyway

log = logging.getLogger(__name__)


@ray.remote(num_cpus=0)  # placed even on a node whose CPUs are all taken
def _working_dir_here() -> str:
    return os.getcwd()


def job_working_dir() -> str:
    """The URI of this job's working dir ("" when the job has none or Ray is not connected)."""
    if not ray.is_initialized():
        return ""
    runtime_env = ray.get_runtime_context().runtime_env
    return runtime_env.working_dir() if hasattr(runtime_env, "working_dir") else runtime_env.get("working_dir", "")


def unpack_on_every_node(timeout: float = UNPACK_TIMEOUT_S) -> int:
    """Run one no-op task of this job on each alive node (each node unpacks the working dir for it), then
    re-enter this process's working directory, which an unpack on another node of this machine may have
    replaced. Returns the number of nodes; 0 when the job has no working dir."""
    uri = job_working_dir()
    if not uri or uri.startswith("local://"):  # a local:// dir is used in place, never unpacked
        return 0
    try:
        path = os.getcwd()
    except FileNotFoundError:  # already replaced: this node's copy is where a worker here runs
        path = None
    here = ray.get_runtime_context().get_node_id()
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    refs = {node: _working_dir_here.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
            .remote() for node in nodes}
    try:
        ray.get(list(refs.values()), timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        log.warning("the job's working dir was not unpacked on every node within %.0fs; going on", timeout)
    if path is None and here in refs:
        path = ray.get(refs[here], timeout=timeout)
    if path and os.path.isdir(path):
        os.chdir(path)  # the same path, now the folder that is there (the old one may have been deleted)
    return len(nodes)
