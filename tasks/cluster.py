"""Cluster bring-up task: connect to `--ray-address` or start a local Ray, and report what it has."""
from __future__ import annotations

from prefect import get_run_logger, task

from miles.cluster.ray_connect import ClusterInfo, connect_ray, disconnect_ray
from miles.config import OrchestrationConfig

__all__ = ["ClusterInfo", "bring_up_cluster", "shut_down_cluster"]


@task(name="bring_up_cluster")
def bring_up_cluster(orchestration: OrchestrationConfig, api_url: str) -> ClusterInfo:
    """Connect or start Ray and report what the cluster has."""
    cluster = connect_ray(orchestration, api_url)
    how = "started a local" if cluster.started_here else "connected to the"
    shown = {k: v for k, v in cluster.resources.items() if not k.startswith("node:")}
    get_run_logger().info(f"{how} Ray cluster at {cluster.address}: {cluster.num_nodes} node(s), {shown}")
    return cluster


def shut_down_cluster() -> None:
    """Disconnect from Ray; a local cluster the run started goes away with it, an existing one stays."""
    disconnect_ray()
