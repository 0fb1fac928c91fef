"""Long-lived services as named, detached Ray actors: tasks start them, later tasks find them.

A Ray actor dies with the process that created it unless it is detached; ours are created
inside task workers, so they are detached and named `<run prefix>-<role>` in the "miles"
namespace, and the flow stops them at the end. `get_if_exists` makes a retried task find
the actor its first attempt started instead of starting a twin.
"""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Any

import ray

from miles.config import EngineConfig, RouterConfig

NAMESPACE = "miles"


@dataclass(frozen=True)
class ServiceInfo:
    """Where a service actor serves: its URL and the PID of the process doing the work."""

    name: str
    url: str
    pid: int


class RouterActor:
    """Owns a router running in this actor's process (in a thread with its own event loop)."""

    def __init__(self, config: RouterConfig):
        from miles.router.server import start_router

        self.handle = start_router(config, host="127.0.0.1", port=None)

    def info(self, name: str) -> ServiceInfo:
        return ServiceInfo(name=name, url=self.handle.url, pid=os.getpid())

    def stats(self, reset: bool = True) -> dict:
        return self.handle.stats(reset)

    def stop(self) -> None:
        self.handle.stop()


class EngineActor:
    """Owns one engine subprocess; relaunches it on the same port when it has died."""

    def __init__(self, model_dir: str, config: EngineConfig, log_path: str):
        self.model_dir, self.config, self.log_path = model_dir, config, log_path
        self.handle = self._launch(port=None)

    def _launch(self, port: int | None):
        from miles.engines.launch import engine_flags, launch_engine

        return launch_engine(self.model_dir, host="127.0.0.1", port=port, engine=self.config.engine,
                             device=self.config.engine_device, max_batch_size=self.config.engine_max_batch_size,
                             extra_args=engine_flags(self.config), log_path=self.log_path)

    def info(self, name: str) -> ServiceInfo:
        return ServiceInfo(name=name, url=self.handle.url, pid=self.handle.pid)

    def alive(self) -> bool:
        return self.handle.alive

    def ensure(self, name: str) -> ServiceInfo:
        """The engine, relaunched on its old port (so the router's entry stays valid) if it died."""
        if not self.handle.alive:
            self.handle = self._launch(port=self.handle.port)
        return self.info(name)

    def kill_engine(self) -> int:
        """Test hook: kill the engine process as a crash would."""
        os.kill(self.handle.pid, signal.SIGKILL)
        self.handle.process.wait()
        return self.handle.pid

    def stop(self) -> None:
        self.handle.stop()


def actor_options(name: str) -> dict[str, Any]:
    # num_cpus=0: services must not hold the CPUs the training tasks are scheduled on;
    # max_restarts=0: a dead service is relaunched by a Prefect task, visibly, not by Ray.
    return dict(name=name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
                num_cpus=0, max_restarts=0, max_concurrency=4)


def get_or_start(cls: type, name: str, *args: Any) -> ray.actor.ActorHandle:
    return ray.remote(cls).options(**actor_options(name)).remote(*args)


def find(name: str) -> ray.actor.ActorHandle | None:
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


def run_actor_names(prefix: str) -> list[str]:
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["namespace"] == NAMESPACE and a["name"].startswith(prefix + "-"))


def stop_run_actors(prefix: str, timeout: float = 60.0) -> list[str]:
    """Stop every actor of a run (their services first, then the actor processes)."""
    names = run_actor_names(prefix)
    for name in names:
        actor = find(name)
        if actor is None:
            continue
        try:
            if hasattr(actor, "stop"):
                ray.get(actor.stop.remote(), timeout=timeout)
        except (ray.exceptions.RayError, AttributeError):
            pass  # already dead or not one of our service actors: killing it below is all that is left
        ray.kill(actor, no_restart=True)
    return names
