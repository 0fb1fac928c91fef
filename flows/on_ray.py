"""The run's work on Ray: services up, engines registered, chunks trained, finish; services stopped."""
from __future__ import annotations

import sys
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_progress_artifact
from prefect_ray import RayTaskRunner
from prefect_ray.context import remote_options
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from flows.chunk_runner import run_chunk_to_end
from flows.plan import plan_for
from miles.config import MilesConfig
from miles.dashboard.cli import command as dashboard_command
from tasks.actors import stop_run_actors
from tasks.finish import RunReport, finish_run
from tasks.options import configured
from tasks.services import engine_alive, launch_engine, register_engine, start_router
from tasks.training import Services, profile_window, start_training_ranks, train_chunk, trainer_prefix


def admin_token(config: MilesConfig) -> str | None:
    from miles.router.app import resolve_admin_token

    return resolve_admin_token(config.router)


def log_dir(config: MilesConfig) -> str:
    return str(Path(config.train.run_dir) / "logs")


def bring_up_services(config: MilesConfig, prefix: str) -> Services:
    """Router, engines and training ranks start side by side; each engine is registered once
    /health_generate passes."""
    o = config.orchestration
    ranks = configured(start_training_ranks, o).submit(config, trainer_prefix(prefix))
    router = configured(start_router, o).submit(config.router, prefix)
    engines = [configured(launch_engine, o).submit(config.engine, config.rollout.hf_checkpoint, prefix, i,
                                                   log_dir(config)) for i in range(config.rollout.rollout_num_engines)]
    router_url = router.result().url
    engine_urls = [e.result().url for e in engines]
    register_all(config, router_url, engine_urls)
    ranks.result()
    return Services(prefix=prefix, router_url=router_url, engine_urls=engine_urls)


def register_all(config: MilesConfig, router_url: str, engine_urls: list[str]) -> None:
    token = admin_token(config)
    registrations = [configured(register_engine, config.orchestration).submit(router_url, url, token)
                     for url in engine_urls]
    for registration in registrations:
        registration.result()


def heal_engines(config: MilesConfig, services: Services) -> None:
    """Relaunch (same port) and re-register engines whose process died; the router failed over meanwhile."""
    dead = [i for i in range(len(services.engine_urls)) if not engine_alive(services.prefix, i)]
    if not dead:
        return
    get_run_logger().warning(f"engines {dead} are down: relaunching and re-registering them")
    relaunched = [configured(launch_engine, config.orchestration).submit(
        config.engine, config.rollout.hf_checkpoint, services.prefix, i, log_dir(config)) for i in dead]
    register_all(config, services.router_url, [r.result().url for r in relaunched])


def progress_bar() -> Progress:
    return Progress(TextColumn("[bold]GRPO"), BarColumn(), MofNCompleteColumn(), TextColumn("rollouts"),
                    TimeElapsedColumn(), disable=not sys.stdout.isatty())


@flow(name="grpo-on-ray", task_runner=RayTaskRunner(), log_prints=True)
def train_on_ray(config: MilesConfig, run_dir: str, prefix: str) -> RunReport:
    """Everything that runs as Ray tasks (Ray itself is up: the task runner reuses it)."""
    o = config.orchestration
    progress_id = create_progress_artifact(progress=0.0, key="grpo-progress", description=f"rollouts of {run_dir}")
    create_markdown_artifact(key="grpo-dashboard", description=f"the web view of {run_dir}",
                             markdown=f"Watch this run (or a copy of its run dir) in the browser:\n\n"
                                      f"```\n{dashboard_command(Path(run_dir))}\n```")
    # Ray must never re-run a task on its own: a rerun would be invisible to Prefect.
    with remote_options(max_retries=0), progress_bar() as bar:
        bar_task = bar.add_task("train", total=config.rollout.num_rollout)
        try:
            services = bring_up_services(config, prefix)
            for chunk in plan_for(config):
                heal_engines(config, services)
                task = profile_window if chunk.profiled else train_chunk
                run_chunk_to_end(configured(task, o), chunk,
                                 dict(config=config, run_dir=run_dir, services=services, progress_id=progress_id),
                                 crash_retries=o.task_retries, run_dir=Path(run_dir),
                                 on_progress=lambda done: bar.update(bar_task, completed=done),
                                 heal=lambda: heal_engines(config, services))
            return configured(finish_run, o).submit(config, run_dir, services).result()
        finally:
            stop_run_actors(prefix)
