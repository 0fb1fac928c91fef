"""Training tasks: a chunk of rollout iterations (resume, run, checkpoint) and the profiling window."""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator
from uuid import UUID

from prefect import task
from prefect.artifacts import update_progress_artifact

from miles.config import MilesConfig
from miles.tracking.row import format_eval
from tasks.chunks import Chunk
from tasks.faults import EngineDown, maybe_fire
from tasks.health import emit_finished, emit_health
from tasks.logs import library_logs_to_prefect
from tasks.services import engine_alive, kill_engine


@dataclass(frozen=True)
class Services:
    """What the training chunks talk to, and the name prefix of the run's Ray actors."""

    prefix: str
    router_url: str
    engine_urls: list[str] = field(default_factory=list)

    @property
    def trainer_prefix(self) -> str:
        return trainer_prefix(self.prefix)


def trainer_prefix(prefix: str) -> str:
    """Name prefix of a run's training ranks (`<prefix>-train-rank<k>`)."""
    return f"{prefix}-train"


@dataclass(frozen=True)
class ChunkResult:
    """A finished chunk: where it resumed, what it ran, and the last iteration's metrics."""

    first: int
    stop: int
    resumed_at: int
    iterations_run: int
    last_metrics: dict[str, float] = field(default_factory=dict)


@task(name="start_training_ranks")
def start_training_ranks(config: MilesConfig, trainer_prefix: str) -> int:
    """The run's training ranks as named Ray actors on the base weights, started while the engines
    start (found, not twinned, on a retry); the chunks attach to them. Returns the world size."""
    from miles.backends.group import ActorGroup

    with library_logs_to_prefect():
        return ActorGroup(config, config.rollout.hf_checkpoint, name_prefix=trainer_prefix).world_size


def open_trainer(config: MilesConfig, run_dir: str, services: Services):
    from miles.trainer import RLTrainer

    return RLTrainer(config, Path(run_dir), rollout_url=services.router_url, engine_urls=services.engine_urls,
                     actor_name_prefix=services.trainer_prefix)


def run_chunk(config: MilesConfig, run_dir: str, chunk: Chunk, services: Services,
              progress_id: UUID | None) -> ChunkResult:
    """Resume from the latest checkpoint, run the chunk's remaining rollouts, checkpoint at its end.

    The ranks outlive the chunk (named actors); the trackers do not: they are closed at the end
    of every attempt, so the next chunk (maybe in another worker process) reopens the same runs
    from the run dir's tracking state and nothing is held open by a process that may be reused."""
    clock = PhaseClock()
    with library_logs_to_prefect():
        with clock("open"):
            trainer = open_trainer(config, run_dir, services)
        try:
            with clock("resume"):
                resumed_at = trainer.resume()
            if resumed_at == 0 and chunk.first == 0:
                with clock("base eval"):
                    write_base_eval(trainer, Path(run_dir))
            todo = range(max(resumed_at, chunk.first), chunk.stop)
            metrics: dict[str, float] = {}
            with clock(f"{len(todo)} iterations"):
                for rollout_id in todo:
                    maybe_fire(config.orchestration.inject_fault, rollout_id, Path(run_dir),
                               kill_engine=lambda: kill_engine(services.prefix, 0))
                    result = trainer.run_iteration(rollout_id)
                    metrics = dict(result.metrics)
                    emit_health(Path(run_dir).name, rollout_id, config.rollout.num_rollout, result.health)
                    trainer.stop_on_red_flag(result)
                    if progress_id is not None:
                        update_progress_artifact(progress_id,
                                                 100.0 * (rollout_id + 1) / config.rollout.num_rollout)
            if todo:
                with clock("checkpoint"):
                    trainer.save_checkpoint(chunk.stop - 1)
            if chunk.stop >= config.rollout.num_rollout:
                emit_finished(Path(run_dir).name, chunk.stop - 1)
        except Exception as exc:
            down = [i for i in range(len(services.engine_urls)) if not engine_alive(services.prefix, i)]
            if down:
                raise EngineDown(f"engines {down} are down ({exc!r}); the flow relaunches them") from exc
            raise
        finally:
            with clock("trackers"):
                # the report and artifacts once, at the run's last chunk (or its retry)
                trainer.tracker.close(final=chunk.stop >= config.rollout.num_rollout)
        print(f"[chunk {chunk.first}-{chunk.stop}] {clock}", flush=True)
        return ChunkResult(chunk.first, chunk.stop, resumed_at, len(todo), metrics)


class PhaseClock:
    """Seconds per phase of a chunk, for the task's log line: where a chunk's time goes beyond its
    iterations (open, resume, checkpoint, trackers) is the orchestration's cost."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def __str__(self) -> str:
        return " ".join(f"{phase} {s:.2f}s" for phase, s in self.seconds.items())


def write_base_eval(trainer, run_dir: Path) -> None:
    """The starting weights' eval, as the plain loop does it (not an iteration: not logged to trackers)."""
    if not trainer.eval_sets:
        return
    base_eval = trainer.evaluate(0, log=False).metrics
    (run_dir / "base_eval.json").write_text(json.dumps(base_eval, indent=2))
    print(format_eval("base eval", base_eval), flush=True)


@task(name="train_chunk", task_run_name="train_chunk[{chunk.first}-{chunk.stop}]", log_prints=True)
def train_chunk(config: MilesConfig, run_dir: str, chunk: Chunk, services: Services,
                progress_id: UUID | None = None) -> ChunkResult:
    """Rollouts chunk.first .. chunk.stop-1; a retry resumes from the chunk's last checkpoint."""
    return run_chunk(config, run_dir, chunk, services, progress_id)


@task(name="profile_window", task_run_name="profile_window[{chunk.first}-{chunk.stop}]", log_prints=True)
def profile_window(config: MilesConfig, run_dir: str, chunk: Chunk, services: Services,
                   progress_id: UUID | None = None) -> ChunkResult:
    """Exactly the profiled rollouts (--profile-step-start .. --profile-step-end), as their own task:
    the trainer opens the profiler for these ids; the task keeps the window visible and retryable."""
    return run_chunk(config, run_dir, chunk, services, progress_id)
