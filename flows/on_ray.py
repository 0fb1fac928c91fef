"""The run's work on Ray, top to bottom: services up, then chunk by chunk (resubmitted after healing the
engines when it fails), finish; the run's actors are stopped at the end whatever happened."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import ray
from prefect import Task, flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_progress_artifact
from prefect.client.orchestration import get_client
from prefect.states import Crashed
from prefect_ray import RayTaskRunner
from prefect_ray.context import remote_options
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from miles.cluster.chunks import Chunk, plan_for
from miles.cluster.service_actors import engine_alive, stop_run_actors
from miles.config import ConfigError, MilesConfig
from miles.config.resolve import run_names
from miles.health import RedFlagStop
from miles.dashboard.cli import command as dashboard_command
from miles.cluster.local import timeline_args, timeline_flag
from miles.router.app import resolve_admin_token
from tasks.finish import RunReport, finish_run
from tasks.options import with_run_retries
from tasks.services import launch_engine, register_engine, start_router
from tasks.training import ChunkResult, RunServices, profile_window, start_training_ranks, train_chunk

POLL_S = 0.5


@flow(name="grpo-on-ray", task_runner=RayTaskRunner(), log_prints=True)
def train_on_ray(config: MilesConfig) -> RunReport:
    """Everything that runs as Ray tasks (Ray itself is up: the task runner reuses it)."""
    o, names = config.orchestration, run_names(config)
    run_dir = config.train.run_dir
    progress_id = create_progress_artifact(progress=0.0, key="grpo-progress", description=f"rollouts of {run_dir}")
    create_markdown_artifact(key="grpo-dashboard", description=f"the web view of {run_dir}",
                             markdown=f"Watch this run (or a copy of its run dir) in the browser:\n\n"
                                      f"```\n{dashboard_command(Path(run_dir))}\n```")
    # Ray must never re-run a task on its own: a rerun would be invisible to Prefect.
    with remote_options(max_retries=0), ProgressBar(config.rollout.num_rollout) as bar:
        try:
            services = bring_up_services(config)
            try:
                for chunk in plan_for(config):
                    task = with_run_retries(profile_window if chunk.profiled else train_chunk, o, retries=False)
                    result = run_chunk_to_end(task, chunk, dict(config=config, services=services,
                                                                progress_id=progress_id),
                                              config, heal=lambda: heal_engines(config, services), on_progress=bar)
                    if result.stop_reason:
                        get_run_logger().warning(f"the run stopped in {task.name}[{chunk.first}-{chunk.stop}]: "
                                                 f"{result.stop_reason}")
                        break
            except RedFlagStop:  # --on-red-flag stop: the artifacts (grpo-health) still, then the run fails
                with_run_retries(finish_run, o).submit(config, services).result()
                raise
            return with_run_retries(finish_run, o).submit(config, services).result()
        finally:
            stop_run_actors(names)


def bring_up_services(config: MilesConfig) -> RunServices:
    """Router, engines and training ranks start side by side; each engine is registered once
    /health_generate passes."""
    o, names = config.orchestration, run_names(config)
    ranks = with_run_retries(start_training_ranks, o).submit(config, names)
    router = with_run_retries(start_router, o).submit(config.router, names, log_dir(config),
                                                      tuple(timeline_flag(Path(config.train.run_dir))))
    engines = [with_run_retries(launch_engine, o).submit(config.engine, config.rollout.hf_checkpoint, names, i,
                                                         log_dir(config), engine_args(config))
               for i in range(config.rollout.rollout_num_engines)]
    services = RunServices(names, router.result().url, [e.result().url for e in engines])
    register_all(config, services.router_url, services.engine_urls)
    ranks.result()
    return services


def log_dir(config: MilesConfig) -> str:
    return str(Path(config.train.run_dir) / "logs")


def engine_args(config: MilesConfig) -> tuple[str, ...]:
    """Serve flags of the run's engines: their decoding goes to the run's timeline (embedded engines)."""
    return tuple(timeline_args(config.engine.engine, Path(config.train.run_dir)))


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
        config.engine, config.rollout.hf_checkpoint, services.names, i, log_dir(config), engine_args(config))
        for i in dead]
    register_all(config, services.router_url, [r.result().url for r in relaunched])


def run_chunk_to_end(task: Task, chunk: Chunk, params: dict, config: MilesConfig, heal: Callable[[], None],
                     on_progress: "ProgressBar") -> ChunkResult:
    """The one retry layer of training: submit the chunk; when it fails (an exception, its Ray worker
    killed, an engine down) heal the engines and submit it again, at most --task-retries times.
    Each attempt resumes from the last checkpoint; a ConfigError is not retried."""
    retries, run_dir = config.orchestration.task_retries, Path(config.train.run_dir)
    for attempt in range(retries + 1):
        future = task.submit(chunk=chunk, **params)
        wait_with_progress(future, run_dir, on_progress)
        state = future.state
        if state.is_completed():
            return future.result()
        where = f"{task.name}[{chunk.first}-{chunk.stop}]"
        if state.is_crashed():
            message = f"the Ray worker of {where} died: {state.message}"
            mark_crashed(future.task_run_id, message)  # a killed worker cannot report it itself
        else:
            error = future.result(raise_on_failure=False)
            if isinstance(error, (ConfigError, RedFlagStop)):  # a bad flag stays bad; a health stop is deliberate
                raise error
            message = f"{where} failed: {error!r}"
        if attempt == retries:
            raise RuntimeError(f"{message}; gave up after {retries + 1} attempts")
        get_run_logger().warning(f"{message}; submitting it again (attempt {attempt + 2} of {retries + 1}), "
                                 f"it resumes from its checkpoint")
        heal()
    raise AssertionError("unreachable")


def journal_rollouts(run_dir: Path) -> int:
    """Iterations in the journal (a cheap progress count while a chunk runs; the base eval is not one)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    with path.open("rb") as f:
        return sum(1 for line in f if not line.startswith(b'{"rollout_id": -1'))


def wait_with_progress(future, run_dir: Path, on_progress: Callable[[int], None]) -> None:
    """Block until the task's Ray object is ready, reporting the journal's length meanwhile."""
    while not ray.wait([future.wrapped_future], timeout=POLL_S)[0]:
        on_progress(journal_rollouts(run_dir))
    on_progress(journal_rollouts(run_dir))
    future.wait()


def mark_crashed(task_run_id, message: str) -> None:
    with get_client(sync_client=True) as client:
        client.set_task_run_state(task_run_id, Crashed(message=message), force=True)


class ProgressBar:
    """The terminal's progress bar (only on a TTY), updated with the number of journal lines."""

    def __init__(self, total: int):
        self.bar = Progress(TextColumn("[bold]GRPO"), BarColumn(), MofNCompleteColumn(), TextColumn("rollouts"),
                            TimeElapsedColumn(), disable=not sys.stdout.isatty())
        self.task = self.bar.add_task("train", total=total)

    def __call__(self, done: int) -> None:
        self.bar.update(self.task, completed=done)

    def __enter__(self) -> "ProgressBar":
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

