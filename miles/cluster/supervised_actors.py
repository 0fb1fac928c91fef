"""Engine supervision for the Prefect flow, whose router and engines are processes owned by named Ray
actors (`service_actors`): each actor's service seen as the supervisor's `Supervised`, relaunches through
the actor (found again, or started anew if the actor itself is gone), and the `--inject-fault` targets."""
from __future__ import annotations

from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

import ray

from miles.cluster.local import engine_args, timeline_flag
from miles.cluster.names import RunNames
from miles.cluster.service_actors import EngineActor, RouterActor, ServiceInfo, find, get_or_start
from miles.record.layout import RunLayout

CALL_TIMEOUT_S = 30.0  # an actor call that checks or kills its service
LAUNCH_TIMEOUT_S = 600.0  # an actor call that relaunches its service (an engine loads its model first)
GONE = -9  # the exit code given to a service whose actor is gone (its process went with it or is orphaned)


class ActorService:
    """One service process owned by a Ray actor, as the engine supervisor watches it."""

    def __init__(self, actor: ray.actor.ActorHandle, info: ServiceInfo):
        self.actor, self.url, self.pid = actor, info.url, info.pid
        self.port = urlsplit(info.url).port

    def exit_code(self) -> int | None:
        try:
            return ray.get(self.actor.exit_code.remote(), timeout=CALL_TIMEOUT_S)
        except ray.exceptions.RayActorError:
            return GONE
        except ray.exceptions.GetTimeoutError:
            return None  # the actor is busy: the /health checks decide whether the service hangs

    def kill(self) -> None:
        try:
            ray.get(self.actor.kill_service.remote(), timeout=CALL_TIMEOUT_S)
        except ray.exceptions.RayActorError:
            pass  # the actor is gone; a relaunch starts a new one


class ActorServices:
    """The run's router and engines through their actors: what the supervisor watches and how it relaunches
    them (on the same port: the router's worker keys stay valid), plus the fault hooks of `FaultTargets`."""

    def __init__(self, config, names: RunNames):
        self.config, self.names = config, names
        run_dir = Path(config.train.run_dir)
        self.layout = RunLayout(run_dir)
        self.router_args = tuple(timeline_flag(run_dir))

    def _service(self, name: str, start: Callable[[], ray.actor.ActorHandle]) -> ActorService:
        actor = find(name) or start()
        return ActorService(actor, ray.get(actor.ensure.remote(name), timeout=LAUNCH_TIMEOUT_S))

    def engine(self, index: int, port: int | None = None) -> ActorService:
        """Engine `index`: its actor's process, relaunched on its port when it died (a new actor if needed)."""
        name = self.names.engine(index)
        return self._service(name, lambda: get_or_start(
            EngineActor, name, self.config.rollout.hf_checkpoint, self.config.engine,
            str(self.layout.log(f"engine-{index}.log")), tuple(engine_args(self.config, index))))

    def router(self, port: int | None = None) -> ActorService:
        name = self.names.router
        return self._service(name, lambda: get_or_start(
            RouterActor, name, self.config.router, str(self.layout.log("router.log")), self.router_args))

    def engines(self) -> list[ActorService]:
        return [self.engine(i) for i in range(self.config.rollout.rollout_num_engines)]

    # ---- FaultTargets (--inject-fault) ----------------------------------------------------------------
    def kill_engine(self, index: int) -> int:
        return ray.get(find(self.names.engine(index)).kill_service.remote(), timeout=CALL_TIMEOUT_S)

    def stop_engine(self, index: int) -> int:
        return ray.get(find(self.names.engine(index)).stop_service.remote(), timeout=CALL_TIMEOUT_S)

    def kill_router(self) -> int:
        return ray.get(find(self.names.router).kill_service.remote(), timeout=CALL_TIMEOUT_S)

    def abort_engine(self, index: int, count: int):
        """Engine `index` aborts its next `count` requests (an abort storm; `stop()` ends it)."""
        from miles.engines.abort_storm import AbortStorm
        from miles.router.app import resolve_admin_token

        return AbortStorm(self.engine(index).url, count, token=resolve_admin_token(self.config.router))


def supervise_actors(config, names: RunNames, router_url: str, admin_token: str | None,
                     on_event: Callable[[str, dict], None] | None = None, log: Callable[[str], None] | None = None):
    """The engine supervisor of a flow chunk (--use-fault-tolerance), started over the run's actors; the
    chunk's trainer attaches its weights, and the chunk stops it at its end."""
    from miles.engines.supervisor import ROUTER_TIMEOUT_S, EngineSupervisor, SupervisionPolicy
    from miles.serving.router_client import RouterClient
    from miles.record.timeline import TIMELINE_NAME, TimelineWriter

    services = ActorServices(config, names)
    return EngineSupervisor(services.engines(), services.engine, SupervisionPolicy.from_config(config.orchestration),
                            RouterClient(router_url, admin_token, timeout=ROUTER_TIMEOUT_S),
                            TimelineWriter(Path(config.train.run_dir) / TIMELINE_NAME),
                            log=log, router_process=services.router(), relaunch_router=services.router,
                            engine_token=admin_token, on_event=on_event).start()
