"""The inference side of a plain run: `--rollout-num-engines` embedded engines and the router in front,
each its own process on loopback."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


@dataclass
class Services:
    rollout_url: str  # where /generate goes: the router, or the only engine
    engine_urls: list[str]
    _stops: list[Callable[[], Any]] = field(default_factory=list, repr=False)

    def stop(self) -> None:
        """Stop the router first (no traffic), then every engine; report the first failure."""
        errors = []
        for stop in reversed(self._stops):
            try:
                stop()
            except Exception as exc:  # keep stopping the rest; re-raised below
                errors.append(exc)
        self._stops.clear()
        if errors:
            raise errors[0]


def timeline_args(engine: str, run_dir: Path) -> list[str]:
    """The flag that makes an embedded engine add its batches to the run's timeline (SGLang cannot)."""
    from miles.tracking.timeline import TIMELINE_NAME

    return ["--timeline-path", str(run_dir / TIMELINE_NAME)] if engine == "embedded" else []


def start_services(config, run_dir: Path, model_dir: Path | None = None, use_router: bool = True) -> Services:
    """Launch the engines on the base model (or `model_dir`), then the router when there are several
    or `use_router`; everything binds to loopback."""
    from miles.engines.launch import engine_flags, launch_engine
    from miles.trainer import resolve_paths

    model_dir = model_dir or resolve_paths(config)[0]
    services = Services(rollout_url="", engine_urls=[])
    e = config.engine
    try:
        for i in range(config.rollout.rollout_num_engines):
            handle = launch_engine(model_dir, host="127.0.0.1", engine=e.engine, device=e.engine_device,
                                   max_batch_size=e.engine_max_batch_size,
                                   log_path=Path(run_dir) / "logs" / f"engine{i}.log",
                                   extra_args=engine_flags(e) + timeline_args(e.engine, Path(run_dir)))
            services._stops.append(handle.stop)
            services.engine_urls.append(handle.url)
        services.rollout_url = services.engine_urls[0]
        if use_router:
            from miles.router.launch import launch_router

            router = launch_router(config.router, host="127.0.0.1", worker_urls=services.engine_urls,
                                   log_path=Path(run_dir) / "logs" / "router.log")
            services._stops.append(router.stop)
            services.rollout_url = router.url
    except BaseException:
        services.stop()
        raise
    return services
