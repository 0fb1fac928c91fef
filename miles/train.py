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
from contextlib import ExitStack
from pathlib import Path

from miles.config import MilesConfig
from miles.config.resolve import require_resolved
from miles.config.commands import runnable
from miles.mlflow_ui.launch import is_server_uri, start_ui, ui_command
from miles.run.observer import LoopOutcome
from miles.run.scorecard import scorecard


def train(config: MilesConfig, use_router: bool = True, observers=()) -> LoopOutcome:
    """Run the driver loop over every rollout of a prepared `config` (`miles.prepare`) with the standard
    observers plus `observers`; engines, router and a Ray started here are stopped at the end."""
    import ray

    from miles.backends.group import ActorGroup
    from miles.cluster.connect import connect
    from miles.cluster.local import start_inference, supervise
    from miles.config.secrets import run_token
    from miles.loop import train_rollouts
    from miles.run.lock import RunDirLock
    from miles.trainer import RLTrainer

    require_resolved(config, "train()")
    o = config.orchestration
    with ExitStack() as stack:  # unwound in reverse: supervisor, engines, router, Ray, token, lock
        # a second trainer on this run dir fails here, naming the holder
        stack.enter_context(RunDirLock(Path(config.train.run_dir)))
        stack.enter_context(run_token(config))  # the router's and engines' admin token
        if not ray.is_initialized() and connect(o.ray_address, o.ray_num_cpus,
                                                o.ray_object_store_mb):
            stack.callback(ray.shutdown)
        # the training ranks load the model while the engines start: both take seconds (minutes on GPUs).
        # Colocated, the ranks settle first: an engine sizes its memory pool by what is free when it starts.
        group = ActorGroup(config, config.rollout.hf_checkpoint, wait=config.train.colocate)
        with ExitStack() as starting:
            # the ranks end with a run that did not start (on a cluster joined by --ray-address too)
            starting.callback(group.kill)
            services = start_inference(config, use_router=use_router)
            stack.callback(services.stop)
            # --use-fault-tolerance: a dead or hung engine is relaunched and readmitted
            supervisor = supervise(config, services) if o.use_fault_tolerance else None
            if supervisor is not None:
                stack.callback(supervisor.stop)  # first: no relaunch may race the services' stop
            trainer = RLTrainer.start(config, services.rollout_url, services.engine_urls,
                                      supervisor=supervisor, group=group)
            starting.pop_all()  # the trainer holds the ranks now
        outcome = train_rollouts(trainer, range(config.rollout.num_rollout), observers,
                                 kill_engine=lambda: services.kill_engine(0), fault_targets=services)
        if supervisor is not None:
            supervisor.stop(finish_healing=True)  # a relaunching engine gets the final weights
            outcome.engine_versions = supervisor.served_versions()
            print("[engines] at the end: " + ", ".join(
                f"engine {i} at weight version {v}" if v is not None else f"engine {i} down"
                for i, v in enumerate(outcome.engine_versions)), flush=True)
        return outcome


def next_steps(config: MilesConfig, links: dict[str, str] | None = None, ui_running: bool = False,
               views: list[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """The scorecard's "where to look next" rows of either driver, as commands that run when pasted
    (the venv need not be activated): the doctor, the dashboard, `views` (the flow's Prefect run),
    then the links the run left (`links`: "mlflow-run", "traces"). The MLflow run's link says how to
    serve a local store unless a UI serves it (`ui_running`, or a tracking server); with no link,
    the command that serves the store."""
    from miles.dashboard.cli import command as dashboard_command

    links, run_dir, uri = links or {}, config.train.run_dir, config.tracking.mlflow_tracking_uri
    steps = [("health", f"{runnable('miles')} doctor {run_dir}"),
             ("dashboard", dashboard_command(Path(run_dir)).removesuffix(" --follow")), *views]
    served = ui_running or is_server_uri(uri)
    if "mlflow-run" in links:
        serve = "" if served else f"  (serve it first: {ui_command(uri)})"
        steps.append(("MLflow", links["mlflow-run"] + serve))
    elif config.tracking.use_mlflow and not served:
        steps.append(("MLflow", ui_command(uri)))
    if "traces" in links:
        steps.append(("traces", links["traces"]))
    return steps


def main(argv: list[str] | None = None) -> int:
    from miles.backends.base import NonFiniteError
    from miles.health import RedFlagStop
    from miles.compare.run_end import compare_at_end
    from miles.dashboard.cli import command as dashboard_command
    from miles.prepare import make_base_model, prepare
    from miles.record.layout import RunLayout
    from miles.run.engine_loss import EnginesLost
    from miles.run.lock import RunDirLock

    started_at = time.time()  # the scorecard's wall time: from here to the scorecard (miles.run.scorecard.WALL_TIME)
    config = prepare(argv, prog="python -m miles.train", make_model=False)  # checked before anything starts
    # a run dir another trainer holds is refused now, not after the model's first build (a minute); train() holds it
    RunDirLock(config.train.run_dir).release()
    run_dir = Path(config.train.run_dir)  # where to watch, before the long work (model, Ray, ...)
    print(f"[trainer] run dir {run_dir} (journal {RunLayout(run_dir).journal}); watch it live: "
          f"{dashboard_command(run_dir)}", flush=True)
    make_base_model(config)
    mlflow_uri, ui_url = config.tracking.mlflow_tracking_uri, None
    if config.tracking.mlflow_ui:
        ui = start_ui(mlflow_uri, run_dir)
        ui_url = ui.url
        print(f"[trainer] MLflow UI {ui.url} (pid {ui.pid}, left up: stop it with `kill {ui.pid}`)", flush=True)
    try:
        outcome = train(config)
    except NonFiniteError as exc:  # nothing non-finite was applied or saved; say why the run stopped
        print(f"python -m miles.train: error: {str(exc).strip().splitlines()[-1]}", file=sys.stderr, flush=True)
        print_scorecard(config, time.time() - started_at, ui_url)  # what it did before it stopped
        return 1
    except EnginesLost as exc:  # the engines are gone: what was trained is checkpointed (miles.loop)
        print(f"python -m miles.train: error: {exc}", file=sys.stderr, flush=True)
        print_scorecard(config, time.time() - started_at, ui_url)
        return 1
    except RedFlagStop as exc:  # --on-red-flag stop: checkpointed; a failed run, not a crash
        print(f"[trainer] stopped: {exc}", flush=True)
        print_scorecard(config, time.time() - started_at, ui_url)
        return 1
    if outcome.stop_reason:
        print(f"[trainer] stopped early: {outcome.stop_reason}", flush=True)
    print_scorecard(config, time.time() - started_at, ui_url)
    compare_at_end(config)  # with --baseline-run-dirs: the verdicts, and the MLflow run's tags
    return 0


def print_scorecard(config: MilesConfig, seconds: float, ui_url: str | None = None) -> None:
    """The run's scorecard in the terminal and as its MLflow run's description, whether it finished or was
    stopped (a red flag, a non-finite gradient): read back from what the run dir holds. With MLflow,
    its MLflow row is the run's page (in `ui_url`'s UI, `--mlflow-ui`), as `miles train`'s card
    gives it."""
    from miles.config.run_info import describe
    from miles.tracking.run_description import describe_mlflow_run

    run_dir = Path(config.train.run_dir)
    link = mlflow_run_link(config, run_dir, ui_url) if config.tracking.use_mlflow else None
    steps = next_steps(config, {"mlflow-run": link} if link else None,
                       ui_running=config.tracking.mlflow_ui)
    card = scorecard(run_dir, config.train.save, seconds, steps)
    print(card.text("python -m miles.train: scorecard"), flush=True)
    if config.tracking.use_mlflow:
        describe_mlflow_run(run_dir, config.tracking.mlflow_tracking_uri, describe(config, run_dir), card.markdown())


def mlflow_run_link(config: MilesConfig, run_dir: Path, ui_url: str | None) -> str | None:
    """The MLflow run's page (review N33: this driver's card gave only the `mlflow ui` command). A
    link is a convenience: a store that cannot be read leaves the card with the command."""
    from miles.mlflow_ui.launch import mlflow_link

    try:
        return mlflow_link(config, run_dir, ui_url)
    except Exception as exc:  # noqa: BLE001 - any store error (MLflow raises its own and sqlite's)
        print(f"[trainer] no MLflow run link: {type(exc).__name__}: {exc}", flush=True)
        return None


if __name__ == "__main__":
    from miles.config import run_main

    run_main(main, "python -m miles.train")
