"""`connect_ray`: join `--ray-address` or start a local Ray sized for this machine (both drivers use it)."""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

import ray

from miles.cluster.names import NAMESPACE
from miles.config import ConfigError

CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ClusterInfo:
    """The Ray cluster a run uses; `started_here` clusters are shut down by the run."""

    address: str
    started_here: bool
    num_nodes: int
    resources: dict[str, float] = field(default_factory=dict)


def worker_env(api_url: str | None) -> dict[str, str]:
    """What every Ray worker must see: the flow's one Prefect API (when there is one), and our cache dir."""
    env = {"PREFECT_API_URL": api_url} if api_url else {}
    for name in ("MILES_CACHE_DIR",):
        if os.environ.get(name):
            env[name] = os.environ[name]
    return env


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Fail fast with the address in the message; `ray.init` itself may wait minutes."""
    if address == "auto":
        return  # resolved by ray.init from the local node's address file, and it fails fast
    host_port = address.removeprefix("ray://")
    host, sep, port = host_port.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError("--ray-address", f"expected HOST:PORT, ray://HOST:PORT or auto, got {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConfigError("--ray-address", f"cannot reach a Ray cluster at {address} ({exc}); "
                                           f"start one with `ray start --head` or leave the flag out") from None


def connect_ray(orchestration, api_url: str | None = None) -> ClusterInfo:
    """ray.init in this process (a Ray already initialised here is used as it is)."""
    runtime_env = {"env_vars": worker_env(api_url)}
    if ray.is_initialized():
        started_here = False
    elif orchestration.ray_address:
        check_reachable(orchestration.ray_address)
        try:
            ray.init(address=orchestration.ray_address, namespace=NAMESPACE, runtime_env=runtime_env,
                     log_to_driver=True)
        except ConnectionError as exc:
            raise ConfigError("--ray-address", f"no Ray cluster at {orchestration.ray_address}: {exc}") from None
        started_here = False
    else:
        ray.init(num_cpus=orchestration.ray_num_cpus or os.cpu_count(),
                 object_store_memory=orchestration.ray_object_store_mb * 2**20,
                 include_dashboard=False, namespace=NAMESPACE, runtime_env=runtime_env)
        started_here = True
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return ClusterInfo(address=ray.get_runtime_context().gcs_address, started_here=started_here,
                       num_nodes=len(nodes), resources=dict(ray.cluster_resources()))


def disconnect_ray() -> None:
    """Disconnect this process; a local cluster it started goes away with it, an existing one stays."""
    if ray.is_initialized():
        ray.shutdown()
