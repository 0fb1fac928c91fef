"""The GRPO training flows, which `miles train` (flows/train_command.py) runs with the config it
prepared (the flags are parsed once); a flow started any other way (a deployment) prepares from its
parameters.

Reads top to bottom. `grpo` makes the tiny model if the run needs it, brings up Ray, then
`train_on_ray` starts the router, engines and ranks and trains chunk by chunk
(`tasks.training.train_chunk` runs the driver loop, `miles.loop`), each chunk resubmitted after
healing the engines when it fails (the one retry layer, `run_chunk_to_end`); then the run is
finished. The flow run's name, tags and description, and what `miles train` hands over, are in
`flows/flow_run.py`.
"""
from __future__ import annotations

from pathlib import Path

from prefect import Task, flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.states import Crashed
from prefect_ray import RayTaskRunner
from prefect_ray.context import remote_options

from flows.bring_up import bring_up_services, heal_engines
from flows.flow_run import (announce_training_run, api_url, command_started_at, describe_flow_run,
                            flow_config, flow_run_name_from_run_dir, tag_training_run)
from flows.progress import ProgressBar, wait_with_progress
from miles.backends.base import NonFiniteError
from miles.cluster.chunks import Chunk, plan_for
from miles.cluster.names import run_names
from miles.cluster.service_actors import stop_run_actors
from miles.config import ConfigError, MilesConfig
from miles.config.run_info import run_name
from miles.config.secrets import export_secrets, run_token
from miles.dashboard.cli import command as dashboard_command
from miles.health import RedFlagStop
from miles.run.faults import require_healable
from miles.run.lock import RunDirLock
from miles.run.observer import LoopOutcome
from miles.run.scorecard import Scorecard
from tasks.cluster import bring_up_cluster, shut_down_cluster
from tasks.finish import finish_run
from tasks.model import make_base_model
from tasks.options import with_run_retries
from tasks.training import RunServices, profile_window, train_chunk


@flow(name="grpo", flow_run_name=flow_run_name_from_run_dir, log_prints=True)
def grpo(config_file: str | None = None, flags: list[str] | None = None) -> Scorecard:
    """GRPO post-training on Ray. `config_file`: a YAML of flags; `flags`: Miles-style flags."""
    # a secret in the YAML goes to the environment, so the subflow's `config` parameter holds none
    started_at = command_started_at()  # the scorecard's wall time (miles.run.scorecard.WALL_TIME)
    config = flow_config(config_file, flags)
    require_healable(config.orchestration.inject_fault, config.orchestration.use_fault_tolerance)
    config = export_secrets(config)
    # the run's router and engines get an admin token (random unless one is given)
    with run_token(config), RunDirLock(config.train.run_dir):  # one trainer per run dir: the next one fails here
        flow_run_url = describe_flow_run(config, config_file, flags)  # travels to the Ray workers' tracker runs
        with_run_retries(make_base_model, config.orchestration)(config)
        with_run_retries(bring_up_cluster, config.orchestration)(config.orchestration, api_url(), flow_run_url)
        try:
            return train_on_ray.with_options(flow_run_name=f"{run_name(config.train.run_dir)}-on-ray")(
                config, started_at=started_at)
        finally:
            shut_down_cluster()


@flow(name="grpo-on-ray", task_runner=RayTaskRunner(), log_prints=True)
def train_on_ray(config: MilesConfig, started_at: float | None = None) -> Scorecard:
    """Everything that runs as Ray tasks (Ray itself is up: the task runner reuses it): services, then the
    chunks, then the finish; the run's actors are stopped at the end whatever happened."""
    o, run_dir = config.orchestration, config.train.run_dir
    training_url = announce_training_run()
    tag_training_run(config)
    create_markdown_artifact(key="grpo-dashboard", description=f"the web view of {run_dir}",
                             markdown=f"Watch this run (or a copy of its run dir) in the browser:\n\n"
                                      f"```\n{dashboard_command(Path(run_dir))}\n```")
    # Ray must never re-run a task on its own: a rerun would be invisible to Prefect.
    with remote_options(max_retries=0), ProgressBar(config.rollout.num_rollout, run_dir) as progress:
        try:
            services = bring_up_services(config)
            try:
                for chunk in plan_for(config):
                    task = with_run_retries(profile_window if chunk.profiled else train_chunk, o, retries=False)
                    result = run_chunk_to_end(task, chunk, config, services, progress)
                    if result.stop_reason:
                        get_run_logger().warning(f"the run stopped in {task.name}[{chunk.iters}]: "
                                                 f"{result.stop_reason}")
                        break
            except (RedFlagStop, NonFiniteError):  # a deliberate stop: the artifacts still, then the run fails
                with_run_retries(finish_run, o).submit(config, services, started_at).result()
                raise
            card = with_run_retries(finish_run, o).submit(config, services, started_at).result()
            if training_url:
                card.links["prefect-training-run"] = training_url
            return card
        finally:
            stop_run_actors(run_names(config))


def run_chunk_to_end(task: Task, chunk: Chunk, config: MilesConfig, services: RunServices,
                     progress: ProgressBar) -> LoopOutcome:
    """The one retry layer of training: submit the chunk; when it fails (an exception, its Ray worker
    killed, an engine down) heal the engines and submit it again, at most --task-retries times.
    Each attempt resumes from the last checkpoint; a ConfigError or a health stop is not retried."""
    retries, run_dir = config.orchestration.task_retries, Path(config.train.run_dir)
    for attempt in range(retries + 1):
        future = task.submit(config=config, chunk=chunk, services=services)
        wait_with_progress(future, run_dir, progress)
        state = future.state
        if state.is_completed():
            return future.result()
        where = f"{task.name}[{chunk.iters}]"
        if state.is_crashed():
            message = f"the Ray worker of {where} died: {state.message}"
            mark_crashed(future.task_run_id, message)  # a killed worker cannot report it itself
        else:
            error = future.result(raise_on_failure=False)
            # a bad flag stays bad, a health stop is deliberate, and a non-finite step comes back on the same
            # data and weights from the same checkpoint: none is retried
            if isinstance(error, (ConfigError, RedFlagStop, NonFiniteError)):
                raise error
            message = f"{where} failed: {error!r}"
        if attempt == retries:
            raise RuntimeError(f"{message}; gave up after {retries + 1} attempts")
        get_run_logger().warning(f"{message}; submitting it again (attempt {attempt + 2} of {retries + 1}), "
                                 f"it resumes from its checkpoint")
        heal_engines(config, services)
    raise AssertionError("unreachable")


def mark_crashed(task_run_id, message: str) -> None:
    with get_client(sync_client=True) as client:
        client.set_task_run_state(task_run_id, Crashed(message=message), force=True)
