"""Service tasks: start the router, launch an engine, register an engine with the router."""
from __future__ import annotations

import time
from pathlib import Path

import httpx
import ray
from prefect import get_run_logger, task

from miles.config import EngineConfig, RouterConfig
from tasks.actors import EngineActor, RouterActor, ServiceInfo, find, get_or_start

ENGINE_READY_TIMEOUT_S = 300.0


def router_name(prefix: str) -> str:
    return f"{prefix}-router"


def engine_name(prefix: str, index: int) -> str:
    return f"{prefix}-engine-{index}"


@task(name="start_router")
def start_router(config: RouterConfig, prefix: str) -> ServiceInfo:
    """The run's router actor (started if missing) and its URL."""
    name = router_name(prefix)
    info = ray.get(get_or_start(RouterActor, name, config).info.remote(name))
    get_run_logger().info(f"router {name} at {info.url}")
    return info


@task(name="launch_engine")
def launch_engine(config: EngineConfig, model_dir: str, prefix: str, index: int, log_dir: str) -> ServiceInfo:
    """Engine `index` of the run: found if running, relaunched if its process died, else started."""
    name = engine_name(prefix, index)
    actor = get_or_start(EngineActor, name, model_dir, config, str(Path(log_dir) / f"engine-{index}.log"))
    info = ray.get(actor.ensure.remote(name))
    get_run_logger().info(f"engine {name} at {info.url} (pid {info.pid})")
    return info


def wait_health_generate(url: str, timeout: float) -> None:
    """Poll the engine's `/health_generate` (a real one-token generation) until it passes."""
    deadline, last = time.monotonic() + timeout, "no answer yet"
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{url}/health_generate", timeout=30.0)
            if response.status_code == 200:
                return
            last = f"HTTP {response.status_code}: {response.text[:200]}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.5)
    raise TimeoutError(f"engine {url} failed /health_generate for {timeout:.0f}s (last: {last})")


@task(name="register_engine")
def register_engine(router_url: str, engine_url: str, admin_token: str | None = None,
                    timeout: float = ENGINE_READY_TIMEOUT_S) -> None:
    """`/health_generate` must pass before the router gets `/add_worker`; already registered is fine."""
    wait_health_generate(engine_url, timeout)
    headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
    response = httpx.post(f"{router_url}/add_worker", params={"url": engine_url}, headers=headers, timeout=30.0)
    if response.status_code not in (200, 409):  # 409: registered by an earlier attempt of this task
        raise RuntimeError(f"router {router_url} refused /add_worker?url={engine_url}: "
                           f"HTTP {response.status_code} {response.text[:300]}")
    get_run_logger().info(f"registered {engine_url} with {router_url}")


def engine_alive(prefix: str, index: int) -> bool:
    """Whether engine `index`'s actor and process are up (asked from the flow between chunks)."""
    actor = find(engine_name(prefix, index))
    if actor is None:
        return False
    try:
        return ray.get(actor.alive.remote(), timeout=30)
    except ray.exceptions.RayError:
        return False


def kill_engine(prefix: str, index: int) -> int:
    """Test hook (`--inject-fault kill-engine@ITER`): kill engine `index`'s process; its PID."""
    return ray.get(find(engine_name(prefix, index)).kill_engine.remote(), timeout=60)
