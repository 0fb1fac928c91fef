"""`python -m miles.train [flags]`: the whole GRPO loop in one process, no Prefect (Miles' train.py).

With no flags it trains the tiny CPU policy on the arithmetic task: `miles.prepare` (parse,
resolve, check, make the tiny model once), connect Ray, start the engines and router on
loopback, then the driver loop (`miles.loop`) over every rollout (the Prefect flow runs the
same loop in chunks). RUN_DIR gets
checkpoints, metrics.jsonl and the logs.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from miles.config import MilesConfig
from miles.config.resolve import require_resolved
from miles.config.commands import runnable
from miles.mlflow_ui.launch import is_server_uri, start_ui, ui_command
from miles.run.scorecard import scorecard


@dataclass
class RunSummary:
    run_dir: Path
    first_rollout_id: int  # 0 for a fresh run, later when resumed
    last_rollout_id: int
    checkpoint: Path | None
    base_eval: dict[str, float] = field(default_factory=dict)  # eval of the starting weights (fresh runs)
    final_metrics: dict[str, float] = field(default_factory=dict)  # the last iteration's row
    seconds: float = 0.0
    stop_reason: str | None = None  # an observer stopped the run early
    # --use-fault-tolerance: the weight version each engine serves at the end (None: down), read off the engines
    engine_versions: list[str | None] = field(default_factory=list)


def train(config: MilesConfig, use_router: bool = True, observers=()) -> RunSummary:
    """Run the driver loop over every rollout of a prepared `config` (`miles.prepare`) with the standard
    observers plus `observers`; engines, router and a Ray started here are stopped at the end."""
    from miles.run.lock import RunDirLock

    require_resolved(config, "train()")
    with RunDirLock(Path(config.train.run_dir)):  # a second trainer on this run dir fails here, naming the holder
        return _train_locked(config, use_router, observers)


def _train_locked(config: MilesConfig, use_router: bool, observers) -> RunSummary:
    from miles.config.secrets import run_token

    # the router's and the engines' admin token: no admin route of the run left open
    with run_token(config):
        return _train_services(config, use_router, observers)


def _train_services(config: MilesConfig, use_router: bool, observers) -> RunSummary:
    import ray

    from miles.backends.group import ActorGroup
    from miles.cluster.connect import connect
    from miles.cluster.local import start_inference, supervise
    from miles.loop import train_rollouts
    from miles.trainer import RLTrainer

    start = time.time()
    o = config.orchestration
    started_ray = not ray.is_initialized() and connect(o.ray_address, o.ray_num_cpus, o.ray_object_store_mb)
    services = supervisor = None
    try:
        # the training ranks load the model while the engines start: both take seconds (minutes on GPUs).
        # Colocated, the ranks settle first: an engine sizes its memory pool by what is free when it starts.
        group = ActorGroup(config, config.rollout.hf_checkpoint, wait=config.train.colocate)
        try:
            services = start_inference(config, use_router=use_router)
            if o.use_fault_tolerance:  # a dead or hung engine is relaunched and readmitted; the run goes on
                supervisor = supervise(config, services)
            trainer = RLTrainer.start(config, services.rollout_url, services.engine_urls, supervisor=supervisor,
                                      group=group)
        except BaseException:
            group.kill()  # ranks on a cluster this run joined (--ray-address) end with it too
            raise
        outcome = train_rollouts(trainer, range(config.rollout.num_rollout), observers,
                                 kill_engine=lambda: services.kill_engine(0), fault_targets=services)
        last = outcome.rollout_ids[-1] if outcome.rollout_ids else outcome.resumed_at - 1
        summary = RunSummary(Path(config.train.run_dir), outcome.resumed_at, last, outcome.checkpoint,
                             outcome.base_eval, outcome.last_metrics, time.time() - start, outcome.stop_reason)
        if supervisor is not None:
            supervisor.stop(finish_healing=True)  # an engine relaunching is brought back at the final weights
            summary.engine_versions = supervisor.served_versions()
            print("[engines] at the end: " + ", ".join(f"engine {i} at weight version {v}" if v is not None else
                                                      f"engine {i} down" for i, v in
                                                      enumerate(summary.engine_versions)), flush=True)
        return summary
    finally:
        try:
            try:
                if supervisor is not None:
                    supervisor.stop()  # first: no relaunch may race the services' stop
            finally:
                if services is not None:
                    services.stop()
        finally:
            if started_ray:
                ray.shutdown()


def next_steps(config: MilesConfig) -> list[tuple[str, str]]:
    """Where to look after the run, as commands that run when pasted (the venv need not be activated)."""
    from miles.dashboard.cli import command as dashboard_command

    run_dir = config.train.run_dir
    steps = [("health", f"{runnable('miles')} doctor {run_dir}"),
             ("dashboard", dashboard_command(Path(run_dir)).removesuffix(" --follow"))]
    uri = config.tracking.mlflow_tracking_uri
    if config.tracking.use_mlflow and not config.tracking.mlflow_ui and not is_server_uri(uri):
        steps.append(("MLflow", ui_command(uri)))
    return steps


def print_where_to_look(config: MilesConfig) -> None:
    from miles.dashboard.cli import command as dashboard_command
    from miles.record.layout import RunLayout

    run_dir = Path(config.train.run_dir)
    print(f"[trainer] run dir {run_dir} (journal {RunLayout(run_dir).journal}); watch it live: "
          f"{dashboard_command(run_dir)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    from miles.backends.base import NonFiniteError
    from miles.health import RedFlagStop
    from miles.compare.run_end import compare_at_end
    from miles.prepare import make_base_model, prepare
    from miles.run.engine_loss import EnginesLost
    from miles.run.lock import RunDirLock

    started_at = time.time()  # the scorecard's wall time: from here to the scorecard (miles.run.scorecard.WALL_TIME)
    config = prepare(argv, prog="python -m miles.train", make_model=False)  # checked before anything starts
    # a run dir another trainer holds is refused now, not after the model's first build (a minute); train() holds it
    RunDirLock(config.train.run_dir).release()
    print_where_to_look(config)  # before the long work: the tiny model's first build, Ray, the engines
    make_base_model(config)
    mlflow_uri = config.tracking.mlflow_tracking_uri
    if config.tracking.mlflow_ui:
        ui = start_ui(mlflow_uri, Path(config.train.run_dir))
        print(f"[trainer] MLflow UI {ui.url} (pid {ui.pid}, left up: stop it with `kill {ui.pid}`)", flush=True)
    try:
        summary = train(config)
    except NonFiniteError as exc:  # nothing non-finite was applied or saved; say why the run stopped
        print(f"python -m miles.train: error: {str(exc).strip().splitlines()[-1]}", file=sys.stderr, flush=True)
        print_scorecard(config, time.time() - started_at)  # what the run did before it stopped
        return 1
    except EnginesLost as exc:  # the engines are gone: what was trained is checkpointed (miles.loop)
        print(f"python -m miles.train: error: {exc}", file=sys.stderr, flush=True)
        print_scorecard(config, time.time() - started_at)
        return 1
    except RedFlagStop as exc:  # --on-red-flag stop: checkpointed; a failed run, not a crash
        print(f"[trainer] stopped: {exc}", flush=True)
        print_scorecard(config, time.time() - started_at)
        return 1
    if summary.stop_reason:
        print(f"[trainer] stopped early: {summary.stop_reason}", flush=True)
    print_scorecard(config, time.time() - started_at)
    compare_at_end(config)  # with --baseline-run-dirs: the verdicts, and the MLflow run's tags
    return 0


def print_scorecard(config: MilesConfig, seconds: float) -> None:
    """The run's scorecard in the terminal and as its MLflow run's description, whether it finished or was
    stopped (a red flag, a non-finite gradient): read back from what the run dir holds."""
    from miles.config.run_info import describe
    from miles.tracking.run_description import describe_mlflow_run

    run_dir = Path(config.train.run_dir)
    card = scorecard(run_dir, config.train.save, seconds, next_steps(config))
    print(card.text("python -m miles.train: scorecard"), flush=True)
    if config.tracking.use_mlflow:
        describe_mlflow_run(run_dir, config.tracking.mlflow_tracking_uri, describe(config, run_dir), card.markdown())


if __name__ == "__main__":
    from miles.config import run_main

    run_main(main, "python -m miles.train")
