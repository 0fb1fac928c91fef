"""The inference side of a plain run: `--rollout-num-engines` embedded engines and the router in front,
each its own process on loopback, each configured by its whole config section."""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from miles.config.secrets import engine_token_env
from miles.serving.process import ServiceProcess
from miles.record.layout import RunLayout


@dataclass
class InferenceServices:
    rollout_url: str  # where /generate goes: the router, or the only engine
    engines: list[ServiceProcess] = field(default_factory=list)
    router: ServiceProcess | None = None
    launch: Callable[[int, int | None], ServiceProcess] | None = field(default=None, repr=False)
    launch_router: Callable[[int | None], ServiceProcess] | None = field(default=None, repr=False)
    admin_token: str | None = field(default=None, repr=False)

    @property
    def engine_urls(self) -> list[str]:
        return [engine.url for engine in self.engines]

    def relaunch_engine(self, index: int, port: int) -> ServiceProcess:
        """Start engine `index` again on `port` (its URL stays the router's worker key); once it generates."""
        engine = self.launch(index, port)
        self.engines[index] = engine
        return engine

    def relaunch_router(self, port: int) -> ServiceProcess:
        """Start the router again on `port` with no workers (the supervisor registers them at their state)."""
        self.router = self.launch_router(port)
        return self.router

    def kill_router(self) -> int:
        """Test hook (`--inject-fault kill-router@ITER`): kill the router as a crash would; its PID."""
        self.router.kill()
        return self.router.pid

    def kill_engine(self, index: int) -> int:
        """Test hook (`--inject-fault kill-engine@ITER`): kill engine `index` as a crash would; its PID."""
        engine = self.engines[index]
        engine.kill()
        return engine.pid

    def stop_engine(self, index: int) -> int:
        """Test hook (`--inject-fault stop-engine:N@ITER`): SIGSTOP engine `index` (alive, never answering)."""
        engine = self.engines[index]
        os.kill(engine.pid, signal.SIGSTOP)
        return engine.pid

    def abort_engine(self, index: int, count: int):
        """Test hook (`--inject-fault abort-engine:N@ITER`): engine `index` aborts its next `count` requests
        (an abort storm, `stop()` ends it)."""
        from miles.engines.abort_storm import AbortStorm

        return AbortStorm(self.engines[index].url, count, token=self.admin_token)

    def stop(self) -> None:
        """Stop the router first (no traffic), then every engine; report the first failure."""
        errors = []
        for service in [self.router, *self.engines]:
            try:
                if service is not None:
                    if service.alive:
                        os.kill(service.pid, signal.SIGCONT)  # a SIGSTOP'd service cannot take SIGTERM
                    service.stop()
            except Exception as exc:  # keep stopping the rest; re-raised below
                errors.append(exc)
        if errors:
            raise errors[0]


def timeline_flag(run_dir: Path) -> list[str]:
    """The flag that makes the router or an embedded engine add its spans to the run's timeline."""
    from miles.record.timeline import TIMELINE_NAME

    return ["--timeline-path", str(run_dir / TIMELINE_NAME)]


def engine_args(config, index: int) -> list[str]:
    """The serve flags of the run's engine `index`: for an embedded engine, the run's timeline, its
    index (its coordinate on its push spans) and a slow-engine-apply fault aimed at it."""
    from miles.engines.push_spans import slow_apply_of

    if config.engine.engine != "embedded":
        return []
    args = [*timeline_flag(Path(config.train.run_dir)), "--engine-index", str(index)]
    slow = slow_apply_of(config.orchestration.inject_fault, index)
    return args + (["--inject-slow-apply", slow] if slow else [])


def start_inference(config, use_router: bool = True) -> InferenceServices:
    """Launch the engines on the resolved config's model, then the router when `use_router`;
    everything binds to loopback and logs to RUN_DIR/logs."""
    from miles.engines.launch import DEFAULT_START_TIMEOUT_S, launch_engine

    from miles.config.secrets import resolve_admin_token

    run_dir = Path(config.train.run_dir)

    def launch(i: int, port: int | None = None, wait: bool = True) -> ServiceProcess:
        return launch_engine(config.rollout.hf_checkpoint, config.engine, host="127.0.0.1", port=port,
                             log_path=RunLayout(run_dir).log(f"engine-{i}.log"),
                             env=engine_token_env(),  # the run's token (miles.train made it); relaunches too
                             serve_args=engine_args(config, i), wait=wait)

    services = InferenceServices(rollout_url="", launch=launch, admin_token=resolve_admin_token(config.router))
    try:
        # embedded engines load their models together; SGLang engines one after another (each sizes its
        # memory pool by what is free on the GPU when it starts)
        together = config.engine.engine == "embedded"
        for i in range(config.rollout.rollout_num_engines):
            services.engines.append(launch(i, wait=not together))
        if together:
            for engine in services.engines:
                engine.wait_ready(DEFAULT_START_TIMEOUT_S)
        services.rollout_url = services.engines[0].url
        if use_router:
            from miles.router.launch import launch_router

            def start_router(port: int | None = None, workers: list[str] = ()) -> ServiceProcess:
                return launch_router(config.router, host="127.0.0.1", port=port, worker_urls=list(workers),
                                     log_path=RunLayout(run_dir).log("router.log"), serve_args=timeline_flag(run_dir))

            services.launch_router = start_router
            services.router = start_router(None, services.engine_urls)
            services.rollout_url = services.router.url
    except BaseException:
        services.stop()
        raise
    return services


def supervise(config, services: InferenceServices):
    """The engine supervisor of a plain run (--use-fault-tolerance), started; the trainer attaches its weights."""
    from miles.engines.supervisor import ROUTER_TIMEOUT_S, EngineSupervisor, SupervisionPolicy
    from miles.serving.router_client import RouterClient
    from miles.record.timeline import TIMELINE_NAME, TimelineWriter

    router = (RouterClient(services.router.url, services.admin_token, timeout=ROUTER_TIMEOUT_S)
              if services.router is not None else None)
    timeline = TimelineWriter(Path(config.train.run_dir) / TIMELINE_NAME)
    return EngineSupervisor(list(services.engines), services.relaunch_engine,
                            SupervisionPolicy.from_config(config.orchestration), router, timeline,
                            router_process=services.router,
                            relaunch_router=services.relaunch_router if services.router is not None else None,
                            engine_token=services.admin_token).start()
