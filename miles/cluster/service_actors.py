"""A run's router and engines as named, detached Ray actors: one task starts them, later tasks find them.

A Ray actor dies with the process that created it unless it is detached; ours are created
inside task workers, so they are detached and named by `RunNames` in the run namespace,
and the flow stops them at the end. `get_if_exists` makes a retried task find the actor its
first attempt started instead of starting a twin.
"""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Any

import ray

from miles.cluster.names import NAMESPACE, RunNames
from miles.config import EngineConfig, RouterConfig


@dataclass(frozen=True)
class ServiceInfo:
    """Where a service actor serves: its URL and the PID of the process doing the work."""

    name: str
    url: str
    pid: int


class ServiceActor:
    """Owns one service subprocess on loopback (its log in the run's logs/); relaunches it on the same
    port when it has died, so the router's entry for it stays valid."""

    def __init__(self, log_path: str):
        self.log_path = log_path
        self.handle = self._launch(port=None)

    def _launch(self, port: int | None):
        raise NotImplementedError

    def info(self, name: str) -> ServiceInfo:
        return ServiceInfo(name=name, url=self.handle.url, pid=self.handle.pid)

    def alive(self) -> bool:
        return self.handle.alive

    def ensure(self, name: str) -> ServiceInfo:
        """The service, relaunched on its old port if it died."""
        if not self.handle.alive:
            self.handle = self._launch(port=self.handle.port)
        return self.info(name)

    def exit_code(self) -> int | None:
        """The service process's exit status, None while it runs (the engine supervisor's check)."""
        return self.handle.exit_code()

    def kill_service(self) -> int:
        """Kill the service process as a crash would (a fault, or the supervisor ending a hung one); its PID."""
        self.handle.kill()
        return self.handle.pid

    def stop_service(self) -> int:
        """Test hook (`--inject-fault stop-engine`): SIGSTOP the service (alive, never answering); its PID."""
        os.kill(self.handle.pid, signal.SIGSTOP)
        return self.handle.pid

    def stop(self) -> None:
        if self.handle.alive:
            os.kill(self.handle.pid, signal.SIGCONT)  # a SIGSTOP'd service cannot take SIGTERM
        self.handle.stop()


class RouterActor(ServiceActor):
    """The run's router process (`miles.router.launch`), configured by the whole router section."""

    def __init__(self, config: RouterConfig, log_path: str, serve_args: tuple[str, ...] = ()):
        self.config, self.serve_args = config, list(serve_args)
        super().__init__(log_path)

    def _launch(self, port: int | None):
        from miles.router.launch import launch_router

        return launch_router(self.config, host="127.0.0.1", port=port, log_path=self.log_path,
                             serve_args=self.serve_args)


class EngineActor(ServiceActor):
    """One engine process (`miles.engines.launch`), configured by the whole engine section."""

    def __init__(self, model_dir: str, config: EngineConfig, log_path: str, serve_args: tuple[str, ...] = ()):
        self.model_dir, self.config, self.serve_args = model_dir, config, list(serve_args)
        super().__init__(log_path)

    def _launch(self, port: int | None):
        from miles.engines.launch import launch_engine

        from miles.config.secrets import engine_token_env

        return launch_engine(self.model_dir, self.config, host="127.0.0.1", port=port, log_path=self.log_path,
                             serve_args=self.serve_args, env=engine_token_env())  # the run's token, from the flow


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


def run_actor_names(names: RunNames) -> list[str]:
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["namespace"] == NAMESPACE and names.owns(a["name"]))


def stop_run_actors(names: RunNames, timeout: float = 60.0) -> list[str]:
    """Stop every actor of a run (their services first, then the actor processes)."""
    found = run_actor_names(names)
    for name in found:
        actor = find(name)
        if actor is None:
            continue
        try:
            if hasattr(actor, "stop"):
                ray.get(actor.stop.remote(), timeout=timeout)
        except (ray.exceptions.RayError, AttributeError):
            pass  # already dead or not one of our service actors: killing it below is all that is left
        ray.kill(actor, no_restart=True)
    return found


def engine_alive(names: RunNames, index: int) -> bool:
    """Whether engine `index`'s actor and process are up."""
    actor = find(names.engine(index))
    if actor is None:
        return False
    try:
        return ray.get(actor.alive.remote(), timeout=30)
    except ray.exceptions.RayError:
        return False


def kill_engine(names: RunNames, index: int) -> int:
    """Test hook (`--inject-fault kill-engine@ITER`): kill engine `index`'s process; its PID."""
    return ray.get(find(names.engine(index)).kill_service.remote(), timeout=60)
