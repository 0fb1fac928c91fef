"""Service tasks: start the router, launch an engine, register an engine with the router."""
from __future__ import annotations

from pathlib import Path

import ray
from prefect import get_run_logger, task

from miles.cluster.names import RunNames
from miles.cluster.service_actors import EngineActor, RouterActor, ServiceInfo, get_or_start
from miles.config import EngineConfig, RouterConfig
from miles.serving.router_client import RouterClient
from miles.serving.process import wait_healthy

ENGINE_READY_TIMEOUT_S = 300.0


@task(name="start_router")
def start_router(config: RouterConfig, names: RunNames, log_dir: str, serve_args: tuple[str, ...] = ()) -> ServiceInfo:
    """The run's router actor (started if missing) and its URL. `serve_args`: further `miles router`
    flags (the run's --timeline-path)."""
    name = names.router
    actor = get_or_start(RouterActor, name, config, str(Path(log_dir) / "router.log"), tuple(serve_args))
    info = ray.get(actor.ensure.remote(name))
    get_run_logger().info(f"router {name} at {info.url}")
    return info


@task(name="launch_engine")
def launch_engine(config: EngineConfig, model_dir: str, names: RunNames, index: int, log_dir: str,
                  serve_args: tuple[str, ...] = ()) -> ServiceInfo:
    """Engine `index` of the run: found if running, relaunched if its process died, else started.
    `serve_args`: further `miles engine` flags (the run's --timeline-path)."""
    name = names.engine(index)
    actor = get_or_start(EngineActor, name, model_dir, config, str(Path(log_dir) / f"engine-{index}.log"),
                         tuple(serve_args))
    info = ray.get(actor.ensure.remote(name))
    get_run_logger().info(f"engine {name} at {info.url} (pid {info.pid})")
    return info


@task(name="register_engine")
def register_engine(router_url: str, engine_url: str, admin_token: str | None = None,
                    timeout: float = ENGINE_READY_TIMEOUT_S) -> None:
    """`/health_generate` must pass before the router gets `/add_worker`; already registered is fine."""
    wait_healthy(engine_url, timeout, path="/health_generate")
    # exist_ok: registered by an earlier attempt of this task (409)
    RouterClient(router_url, admin_token).add_worker(engine_url, exist_ok=True)
    get_run_logger().info(f"registered {engine_url} with {router_url}")
