"""The inference side of a plain run: `--rollout-num-engines` embedded engines and the router in front,
each its own process on loopback, each configured by its whole config section."""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from miles.config.secrets import engine_token_env
from miles.serving.process import ServiceProcess
from miles.record.layout import RunLayout


@dataclass
class InferenceServices:
    rollout_url: str  # where /generate goes: the router, or the only engine
    engines: list[ServiceProcess] = field(default_factory=list)
    router: ServiceProcess | None = None

    @property
    def engine_urls(self) -> list[str]:
        return [engine.url for engine in self.engines]

    def kill_engine(self, index: int) -> int:
        """Test hook (`--inject-fault kill-engine@ITER`): kill engine `index` as a crash would; its PID."""
        engine = self.engines[index]
        os.kill(engine.pid, signal.SIGKILL)
        engine.process.wait()
        return engine.pid

    def stop(self) -> None:
        """Stop the router first (no traffic), then every engine; report the first failure."""
        errors = []
        for service in [self.router, *self.engines]:
            try:
                if service is not None:
                    service.stop()
            except Exception as exc:  # keep stopping the rest; re-raised below
                errors.append(exc)
        if errors:
            raise errors[0]


def timeline_flag(run_dir: Path) -> list[str]:
    """The flag that makes the router or an embedded engine add its spans to the run's timeline."""
    from miles.record.timeline import TIMELINE_NAME

    return ["--timeline-path", str(run_dir / TIMELINE_NAME)]


def timeline_args(engine: str, run_dir: Path) -> list[str]:
    """The timeline flag for an engine: embedded engines only (SGLang cannot write spans)."""
    return timeline_flag(run_dir) if engine == "embedded" else []


def start_inference(config, use_router: bool = True) -> InferenceServices:
    """Launch the engines on the resolved config's model, then the router when `use_router`;
    everything binds to loopback and logs to RUN_DIR/logs."""
    from miles.engines.launch import launch_engine

    run_dir = Path(config.train.run_dir)
    services = InferenceServices(rollout_url="")
    try:
        for i in range(config.rollout.rollout_num_engines):
            services.engines.append(launch_engine(config.rollout.hf_checkpoint, config.engine, host="127.0.0.1",
                                                  log_path=RunLayout(run_dir).log(f"engine-{i}.log"),
                                                  env=engine_token_env(),  # the run's token (miles.train made it)
                                                  serve_args=timeline_args(config.engine.engine, run_dir)))
        services.rollout_url = services.engines[0].url
        if use_router:
            from miles.router.launch import launch_router

            services.router = launch_router(config.router, host="127.0.0.1", worker_urls=services.engine_urls,
                                            log_path=RunLayout(run_dir).log("router.log"),
                                            serve_args=timeline_flag(run_dir))
            services.rollout_url = services.router.url
    except BaseException:
        services.stop()
        raise
    return services
