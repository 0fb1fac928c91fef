"""Cluster bring-up: connect to `--ray-address` (or the Ray job's cluster) or start a local Ray sized for this machine."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import ray
from prefect import get_run_logger, task

from miles.config import OrchestrationConfig
from miles.config.cache import CACHE_ENV
from miles.config.secrets import RUN_TOKEN_ENV
from miles.cluster.connect import connect
from miles.config.run_info import FLOW_RUN_URL_ENV


@dataclass(frozen=True)
class ClusterInfo:
    """The Ray cluster a run uses; `started_here` clusters are shut down by the run."""

    address: str
    started_here: bool
    num_nodes: int
    resources: dict[str, float] = field(default_factory=dict)


# A task's log line reaches the terminal through Ray, which already puts `(train_chunk pid=N)` before it;
# Prefect's own console prefix (time | level | Task run 'train_chunk[iter 0..9]' - ) on top made ~95 columns
# before each row. On the Ray workers the console shows the message alone; the Prefect UI keeps the
# task run, level and time of every line (its API handler does not use this format).
TERSE_TASK_LOGS = {"PREFECT_LOGGING_FORMATTERS_STANDARD_TASK_RUN_FMT": "%(message)s"}

# The chunk tasks run the trackers' delivery process in a Ray worker, so a local cluster's workers keep
# the tracker and artifact-store credentials (wandb, MLflow, and the cloud stores MLflow uploads to);
# every other secret-named variable stays in the flow's process (miles.cluster.connect).
TRACKER_ENV_PREFIXES = ("WANDB_", "MLFLOW_", "AWS_", "AZURE_", "GOOGLE_")


def tracker_env_names() -> frozenset[str]:
    """And the run's admin token: the actors that start the router and engines and the chunk tasks that
    push weights need it (miles.config.secrets.ensure_run_token)."""
    return frozenset(k for k in os.environ if k.startswith(TRACKER_ENV_PREFIXES)) | {RUN_TOKEN_ENV}


def worker_env(api_url: str, flow_run_url: str | None = None) -> dict[str, str]:
    """What every Ray worker must see: the flow's one Prefect API, our cache dir, the flow run's link
    (for the tracker runs' tags)."""
    env = {"PREFECT_API_URL": api_url, **({FLOW_RUN_URL_ENV: flow_run_url} if flow_run_url else {}), **TERSE_TASK_LOGS}
    for name in (CACHE_ENV,):
        if os.environ.get(name):
            env[name] = os.environ[name]
    return env


def connect_ray(orchestration: OrchestrationConfig, api_url: str, flow_run_url: str | None = None) -> ClusterInfo:
    """ray.init in this process (the flow's): the Ray task runner then submits to this cluster."""
    if ray.is_initialized():
        started_here = False
    else:
        started_here = connect(orchestration.ray_address, orchestration.ray_num_cpus,
                               orchestration.ray_object_store_mb, runtime_env={"env_vars": worker_env(api_url, flow_run_url)},
                               keep_env=tracker_env_names())
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return ClusterInfo(address=ray.get_runtime_context().gcs_address, started_here=started_here,
                       num_nodes=len(nodes), resources=dict(ray.cluster_resources()))


@task(name="bring_up_cluster")
def bring_up_cluster(orchestration: OrchestrationConfig, api_url: str, flow_run_url: str | None = None) -> ClusterInfo:
    """Connect or start Ray and report what the cluster has."""
    cluster = connect_ray(orchestration, api_url, flow_run_url)
    how = "started a local" if cluster.started_here else "connected to the"
    shown = {k: v for k, v in cluster.resources.items() if not k.startswith("node:")}
    get_run_logger().info(f"{how} Ray cluster at {cluster.address}: {cluster.num_nodes} node(s), {shown}")
    return cluster


def shut_down_cluster() -> None:
    """Disconnect from Ray; a local cluster the run started goes away with it, an existing one stays."""
    if ray.is_initialized():
        ray.shutdown()
