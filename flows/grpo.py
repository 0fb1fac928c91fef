"""The GRPO training flows, which `miles train` (flows/train_command.py) runs with the config it prepared
(the flags are parsed once); a flow started any other way (a deployment) prepares from its parameters.

Reads top to bottom. `grpo` makes the tiny model if the run needs it, brings up Ray, then `train_on_ray` starts the router, engines and ranks and trains chunk by chunk
(`tasks.training.train_chunk` runs the driver loop, `miles.loop`), each chunk resubmitted after healing
the engines when it fails; then the run is finished.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from prefect import Task, flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL
from prefect.states import Crashed
from prefect_ray import RayTaskRunner
from prefect_ray.context import remote_options

from flows.bring_up import bring_up_services, heal_engines
from flows.flow_args import build_argv, config_source, flag_value, flow_parameters
from flows.progress import ProgressBar, wait_with_progress
from miles.backends.base import NonFiniteError
from miles.cluster.chunks import Chunk, plan_for
from miles.cluster.names import run_names
from miles.cluster.service_actors import stop_run_actors
from miles.config import ConfigError, MilesConfig
from miles.config.parse import load_yaml
from miles.config.secrets import export_secrets, run_token
from miles.dashboard.cli import command as dashboard_command
from miles.health import RedFlagStop
from miles.prepare import prepare
from miles.config.run_info import describe, run_name, task_name
from miles.run.lock import RunDirLock
from tasks.cluster import bring_up_cluster, shut_down_cluster
from tasks.finish import RunReport, finish_run
from tasks.model import make_base_model
from tasks.options import with_run_retries
from tasks.training import ChunkResult, RunServices, profile_window, train_chunk


STARTED_AT_ENV = "MILES_COMMAND_STARTED_AT"  # when `miles train` started, for the flow it runs in-process


def command_started_at() -> float:
    """When `miles train` started (its STARTED_AT_ENV), so that the scorecard's wall time is the command's
    in the terminal, the Prefect artifact and MLflow alike; now, for a flow run started otherwise (a
    deployment, `prefect` itself)."""
    try:
        started = float(os.environ.get(STARTED_AT_ENV, ""))
    except ValueError:
        return time.time()
    return started if 0 < started <= time.time() else time.time()


def refuse_unhealable_faults(config: MilesConfig) -> MilesConfig:
    """Without --use-fault-tolerance a dead engine fails its chunk's task, which the flow resubmits from the
    chunk's last checkpoint after relaunching the engine; a stopped engine or a killed router would only
    hang or fail that chunk. So those faults need the supervisor; say so before anything starts."""
    from miles.run.faults import parse_faults

    o = config.orchestration
    for fault in parse_faults(o.inject_fault):
        if not o.use_fault_tolerance and fault.kind in ("stop-engine", "kill-router"):
            raise ConfigError("--inject-fault", f"{fault.name!r} needs --use-fault-tolerance in `miles train` "
                                                f"(without it only kill-engine[:N]@ITER, healed by a chunk retry)")
    return config


# `miles train`'s prepared config and the flow argv it stands for, while `main` runs the flow in this process
_handed_over: list[tuple[list[str], MilesConfig]] = []


@contextmanager
def handing_over(config: MilesConfig, argv: list[str]) -> Iterator[None]:
    """Inside the block, the `grpo` flow called with `argv` (as `flow_parameters` splits it) takes `config`,
    which `main` prepared from those flags, instead of parsing, resolving and checking them again."""
    _handed_over.append((build_argv(**flow_parameters(argv)), config))
    try:
        yield
    finally:
        _handed_over.pop()


def flow_config(config_file: str | None, flags: list[str] | None) -> MilesConfig:
    """The flow's config: the one `miles train` handed over for these very parameters, else prepared now
    (a deployment, a direct call of the flow)."""
    argv = build_argv(config_file, flags)
    if _handed_over and _handed_over[-1][0] == argv:
        return _handed_over[-1][1]
    return prepare(argv, make_model=False)  # the flow makes the model in a task of its own


def flow_run_name_from_run_dir() -> str:
    """The `grpo` flow run's name from its first log line on: its run dir's name when the flags (or their
    YAML) give one; otherwise Prefect's usual random name, until `describe_flow_run` renames the run after
    the run dir `prepare` picks."""
    from prefect.context import FlowRunContext
    from prefect.utilities.names import generate_slug

    context = FlowRunContext.get()
    parameters = (context.parameters if context else None) or {}
    run_dir = given_run_dir(parameters.get("config_file"), parameters.get("flags"))
    return run_name(run_dir) if run_dir else generate_slug(2)


def given_run_dir(config_file: str | None, flags: list[str] | None) -> str | None:
    """The run dir the flags name (`miles train` always adds --run-dir), else their YAML; None: neither
    (`prepare` picks one). Read off the flags, not parsed: a bad flag is for the flow's prepare to report."""
    given = flag_value(list(flags or []), "--run-dir")
    source = config_source(config_file, flags)
    if given or source is None:
        return given
    try:
        from_yaml = load_yaml(source).get("run_dir")
    except (ConfigError, OSError):  # a missing, unreadable or bad YAML: the flow's prepare says so
        return None
    return str(from_yaml) if from_yaml else None


@flow(name="grpo", flow_run_name=flow_run_name_from_run_dir, log_prints=True)
def grpo(config_file: str | None = None, flags: list[str] | None = None) -> RunReport:
    """GRPO post-training on Ray. `config_file`: a YAML of flags; `flags`: Miles-style flags."""
    # a secret in the YAML goes to the environment, so the subflow's `config` parameter holds none
    started_at = command_started_at()  # the scorecard's wall time (miles.run.scorecard.WALL_TIME)
    config = export_secrets(refuse_unhealable_faults(flow_config(config_file, flags)))
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
def train_on_ray(config: MilesConfig, started_at: float | None = None) -> RunReport:
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
                        get_run_logger().warning(f"the run stopped in {task.name}[{chunk.first}-{chunk.stop}]: "
                                                 f"{result.stop_reason}")
                        break
            except (RedFlagStop, NonFiniteError):  # a deliberate stop: the artifacts still, then the run fails
                with_run_retries(finish_run, o).submit(config, services, started_at).result()
                raise
            report = with_run_retries(finish_run, o).submit(config, services, started_at).result()
            if training_url:
                report.links["prefect-training-run"] = training_url
            return report
        finally:
            stop_run_actors(run_names(config))


def announce_training_run() -> str:
    """Say which flow run trains: the link Prefect prints first is the parent's (cluster bring-up only),
    while the chunks, their logs and most artifacts are on this one."""
    from prefect.context import get_run_context
    from prefect.utilities.urls import url_for

    flow_run = get_run_context().flow_run
    url = url_for(flow_run) or ""
    if url:
        get_run_logger().info(f"training in flow run {flow_run.name!r} (the chunks, their logs, the artifacts): {url}")
    return url


def run_chunk_to_end(task: Task, chunk: Chunk, config: MilesConfig, services: RunServices,
                     progress: ProgressBar) -> ChunkResult:
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
        where = f"{task.name}[{chunk.first}-{chunk.stop}]"
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


# ---- the flow run's name, description and Prefect API -------------------------------------
def api_url() -> str:
    url = PREFECT_API_URL.value()
    if not url:
        raise ConfigError("PREFECT_API_URL", "the flow needs a real Prefect server that its Ray workers can reach; "
                                             "run it with `miles train` (starts one) or set PREFECT_API_URL")
    return url


def run_tags_of(config: MilesConfig, flow_run) -> list[str]:
    """The flow run's tags with the run's backend and task, on the parent and on the subflow that trains."""
    return sorted({*flow_run.tags, f"backend:{config.train.train_backend}", f"task:{task_name(config)}"})


def tag_training_run(config: MilesConfig) -> list[str]:
    """Tag this (the training) flow run as its parent is tagged: filtering by `backend:fsdp` or `task:...`
    in the Prefect UI found only the parent, which trains nothing (first-hour N18). Returns the tags."""
    from prefect.context import get_run_context

    flow_run = get_run_context().flow_run
    tags = run_tags_of(config, flow_run)
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, tags=tags)
    return tags


def describe_flow_run(config: MilesConfig, config_file: str | None, flags: list[str] | None) -> str:
    """Names this flow run after its run dir, tags it with backend and task, and describes it (which
    config, which flags) in the `grpo-run` artifact, since Prefect flow runs have no description field.
    Returns the flow run's UI link, which the Ray workers put on their tracker runs."""
    from prefect.context import get_run_context
    from prefect.utilities.urls import url_for

    flow_run = get_run_context().flow_run
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, name=run_name(config.train.run_dir), tags=run_tags_of(config, flow_run))
    source, name = config_source(config_file, flags), run_name(config.train.run_dir)
    # the description is the artifact list's one-line caption: it names what the body holds, not the body again
    create_markdown_artifact(key="grpo-run", description=f"config, flags and run dir of {name}", markdown="\n".join([
        f"## {name}", "", describe(config, config.train.run_dir), "",
        f"- config: `{source}`" if source else "- config: flags only (no YAML)",
        f"- flags: `{' '.join(flags or []) or '(none)'}`", f"- run dir: `{config.train.run_dir}`"]))
    return url_for(flow_run) or ""

