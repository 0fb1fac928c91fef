"""Training tasks: start the run's ranks, and run one chunk of the driver loop (`miles.loop.train_rollouts`)."""
from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from pathlib import Path

from prefect import task
from prefect.artifacts import create_table_artifact

from miles.cluster.chunks import Chunk
from miles.cluster.names import RunNames
from miles.config import MilesConfig
from miles.run.observer import LoopOutcome, Observer
from miles.config.run_info import FLOW_RUN_URL_ENV, run_name
from tasks.health import (diagnose_artifacts, emit_engine_state, emit_finished, emit_health, emit_red_flag,
                          emit_staleness_tightened)
from tasks.logs import library_logs_to_prefect


@dataclass(frozen=True)
class RunServices:
    """What the training chunks talk to: the router and the engines, and the names of the run's actors."""

    names: RunNames
    router_url: str
    engine_urls: list[str] = field(default_factory=list)


class HealthEvents(Observer):
    """The health watch's Prefect events: one per iteration (and per red flag that starts), and one when
    the run's last rollout is done or a red flag stops it (it closes the stall watch's window)."""

    def __init__(self, config: MilesConfig):
        self.run_name, self.num_rollout = run_name(config.train.run_dir), config.rollout.num_rollout
        self.run_dir = config.train.run_dir
        self.stops = config.health.on_red_flag == "stop"
        # a live red flag comes from the health watch's timer thread: run its reaction in the task's context,
        # so that Prefect relates the event and the artifacts to this task run
        self.context = contextvars.copy_context()

    def live_red_flag(self, verdict, diagnosis) -> None:
        """A phase hung far past its median: the red-flag event now, and the diagnose bundle as artifacts."""
        def report():
            emit_red_flag(self.run_name, verdict)
            diagnose_artifacts(self.run_dir, verdict, diagnosis)
        self.context.copy().run(report)

    def after_iteration(self, result) -> None:
        emit_health(self.run_name, result.rollout_id, self.num_rollout, result.health, result.metrics)
        if result.metrics.get("rollout/staleness_guard/tightened"):
            emit_staleness_tightened(self.run_name, result.rollout_id, result.metrics)
        if result.rollout_id == self.num_rollout - 1 or (self.stops and result.health.red):
            emit_finished(self.run_name, result.rollout_id)


@task(name="start_training_ranks")
def start_training_ranks(config: MilesConfig, names: RunNames) -> int:
    """The run's training ranks as named Ray actors on the base weights, started while the engines
    start (found, not twinned, on a retry); the chunks attach to them. Returns the world size."""
    from miles.backends.group import ActorGroup

    with library_logs_to_prefect():
        return ActorGroup(config, config.rollout.hf_checkpoint, names).world_size


def run_chunk(config: MilesConfig, chunk: Chunk, services: RunServices) -> LoopOutcome:
    """The driver loop over the chunk's rollouts, on the run's named ranks (they outlive the chunk;
    the trackers are closed at its end, so the next chunk may run in another process). A red-flag
    stop fails the task with the flag; the flow does not resubmit it."""
    from miles.cluster.supervised_actors import ActorServices
    from miles.loop import train_rollouts
    from miles.trainer import RLTrainer

    targets = ActorServices(config, services.names)  # --inject-fault hits the actors' services
    link_tracker_runs_to_this_flow_run()
    with library_logs_to_prefect():
        supervisor = start_supervisor(config, services)
        try:
            trainer = RLTrainer.start(config, services.router_url, services.engine_urls, services.names,
                                      supervisor=supervisor)
            return train_rollouts(trainer, chunk.rollouts, [HealthEvents(config)],
                                  kill_engine=lambda: targets.kill_engine(0), fault_targets=targets)
        finally:
            if supervisor is not None:  # an engine relaunching now is brought back before the next chunk
                supervisor.stop(finish_healing=True)


def link_tracker_runs_to_this_flow_run() -> str | None:
    """Point the tracker runs this chunk opens (MLflow's `prefect.flow_run_url` tag) at the flow run this task
    belongs to, the one that trains: the URL the cluster's workers were started with is the parent's, which
    only builds the model and the cluster (first-hour N13). Returns the URL, None outside a flow run."""
    import os

    from prefect.runtime import flow_run
    from prefect.utilities.urls import url_for

    flow_run_id = flow_run.get_id()
    url = url_for("flow-run", obj_id=flow_run_id) if flow_run_id else None
    if url:
        os.environ[FLOW_RUN_URL_ENV] = url  # read by miles.config.run_info.run_tags in this worker
    return url


def start_supervisor(config: MilesConfig, services: RunServices):
    """With --use-fault-tolerance, the chunk's engine supervisor over the run's actors: a dead or hung engine
    (or router) is relaunched and readmitted while the chunk goes on, each state change a Prefect event."""
    if not config.orchestration.use_fault_tolerance:
        return None
    from miles.cluster.supervised_actors import supervise_actors
    from miles.config.secrets import resolve_admin_token

    name, context = run_name(config.train.run_dir), contextvars.copy_context()

    def on_event(change: str, fields: dict) -> None:  # from the supervisor's threads, in this task's context
        context.copy().run(emit_engine_state, name, change, fields)

    return supervise_actors(config, services.names, services.router_url, resolve_admin_token(config.router),
                            on_event=on_event)


@task(name="train_chunk", task_run_name="train_chunk[{chunk.iters}]", log_prints=True)
def train_chunk(config: MilesConfig, chunk: Chunk, services: RunServices) -> LoopOutcome:
    """Rollouts chunk.first .. chunk.stop-1; a resubmission resumes from the chunk's last checkpoint."""
    return run_chunk(config, chunk, services)


@task(name="profile_window", task_run_name="profile_window[{chunk.iters}]", log_prints=True)
def profile_window(config: MilesConfig, chunk: Chunk, services: RunServices) -> LoopOutcome:
    """Exactly the profiled rollouts (--profile-step-start .. --profile-step-end), as their own task:
    the trainer's profiler opens the window for these ids; the task keeps the window visible and
    retryable and leaves its summary (top operators, span totals, trace files) as a table artifact."""
    from miles.profiling.summary import read_summaries, summary_rows

    result = run_chunk(config, chunk, services)
    run_dir = Path(config.train.run_dir)
    create_table_artifact(summary_rows(read_summaries(run_dir, chunk.first, chunk.stop)),
                          key="profile-window-" + chunk.iters.replace(" ", "-").replace("..", "-"),
                          description=f"Profiled rollouts ({chunk.iters}): top operators by self "
                                      f"time and span totals per trace (files under {run_dir})")
    return result
