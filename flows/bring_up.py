"""The run's services on Ray: router, engines and training ranks started side by side, engines registered
once they answer, and dead engines relaunched and registered again between chunk attempts."""
from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger

from miles.cluster.local import engine_args, timeline_flag
from miles.cluster.names import run_names
from miles.cluster.service_actors import engine_alive
from miles.config import MilesConfig
from miles.record.layout import RunLayout
from miles.config.secrets import resolve_admin_token
from tasks.options import with_run_retries
from tasks.services import launch_engine, register_engine, start_router
from tasks.training import RunServices, start_training_ranks


def bring_up_services(config: MilesConfig) -> RunServices:
    """Router, engines and training ranks start side by side; each engine is registered once
    /health_generate passes."""
    o, names = config.orchestration, run_names(config)
    ranks = with_run_retries(start_training_ranks, o).submit(config, names)
    router = with_run_retries(start_router, o).submit(config.router, names, log_dir(config),
                                                      tuple(timeline_flag(Path(config.train.run_dir))))
    engines = [with_run_retries(launch_engine, o).submit(
        config.engine, config.rollout.hf_checkpoint, names, i, log_dir(config),
        tuple(engine_args(config, i))) for i in range(config.rollout.rollout_num_engines)]
    services = RunServices(names, router.result().url, [e.result().url for e in engines])
    register_all(config, services.router_url, services.engine_urls)
    ranks.result()
    return services


def log_dir(config: MilesConfig) -> str:
    return str(RunLayout(config.train.run_dir).logs)


def register_all(config: MilesConfig, router_url: str, engine_urls: list[str]) -> None:
    token = resolve_admin_token(config.router)
    registrations = [with_run_retries(register_engine, config.orchestration).submit(router_url, url, token)
                     for url in engine_urls]
    for registration in registrations:
        registration.result()


def heal_engines(config: MilesConfig, services: RunServices) -> None:
    """Relaunch (same port) and re-register engines whose process died; the router failed over meanwhile."""
    dead = [i for i in range(len(services.engine_urls)) if not engine_alive(services.names, i)]
    if not dead:
        return
    get_run_logger().warning(f"engines {dead} are down: relaunching and re-registering them")
    relaunched = [with_run_retries(launch_engine, config.orchestration).submit(
        config.engine, config.rollout.hf_checkpoint, services.names, i, log_dir(config),
        tuple(engine_args(config, i)))
        for i in dead]
    register_all(config, services.router_url, [r.result().url for r in relaunched])
