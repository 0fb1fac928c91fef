"""`python -m miles.train [flags]`: the whole GRPO loop in one process, no Prefect (Miles' train.py).

With no flags it trains the tiny CPU policy on the arithmetic task: engines and router
start on loopback, the training ranks (FSDP or Megatron) run as Ray actors, and RUN_DIR
gets checkpoints and metrics.jsonl. The Prefect flow runs the same `RLTrainer` in retryable chunks instead.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from miles.config import MilesConfig, parse_config
from miles.tracking.sinks.mlflow_sink import default_tracking_uri
from miles.tracking.mlflow_ui import is_server_uri, start_ui, ui_command
from miles.tracking.names import map_metrics
from miles.tracking.row import format_eval


@dataclass
class RunSummary:
    run_dir: Path
    first_rollout_id: int  # 0 for a fresh run, later when resumed
    last_rollout_id: int
    checkpoint: Path | None
    base_eval: dict[str, float] = field(default_factory=dict)  # eval of the starting weights (fresh runs)
    final_metrics: dict[str, float] = field(default_factory=dict)  # the last iteration's row
    seconds: float = 0.0


def default_run_dir(config: MilesConfig) -> Path:
    return Path(config.train.run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S"))


def train(config: MilesConfig, use_router: bool = True) -> RunSummary:
    from miles.run_lock import RunDirLock
    from miles.trainer import preflight

    preflight(config)  # a bad hook or data path fails here, before any engine or actor starts
    start = time.time()
    run_dir = default_run_dir(config)
    with RunDirLock(run_dir):  # a second trainer on this run dir fails here, naming the holder
        return _train_locked(config, run_dir, use_router, start)


def _train_locked(config: MilesConfig, run_dir: Path, use_router: bool, start: float) -> RunSummary:
    from miles.services import start_services
    from miles.trainer import RLTrainer

    services = start_services(config, run_dir, use_router=use_router)
    trainer = None
    try:
        trainer = RLTrainer(config, run_dir, services.rollout_url, services.engine_urls)
        first = trainer.resume()
        base_eval = {}
        if first == 0 and trainer.eval_sets:
            base_eval = trainer.evaluate(0, log=False).metrics
            (run_dir / "base_eval.json").write_text(json.dumps(base_eval, indent=2))
            print(format_eval("base eval", base_eval), flush=True)
        result, saved = None, None
        for rollout_id in range(first, config.rollout.num_rollout):
            result = trainer.run_iteration(rollout_id)
            trainer.stop_on_red_flag(result)
            interval = config.train.save_interval
            if (interval and (rollout_id + 1) % interval == 0) or rollout_id == config.rollout.num_rollout - 1:
                saved = trainer.save_checkpoint(rollout_id)
        return RunSummary(run_dir, first, config.rollout.num_rollout - 1, saved, base_eval,
                          result.metrics if result else {}, time.time() - start)
    finally:
        if trainer is not None:
            trainer.close()
        services.stop()


def main(argv: list[str] | None = None) -> int:
    from miles.backends.base import NonFiniteError
    from miles.health import RedFlagStop

    config = parse_config(argv, prog="python -m miles.train")
    config = config.replace(run_dir=str(default_run_dir(config)))  # one run dir for the run and its MLflow store
    mlflow_uri = config.tracking.mlflow_tracking_uri or default_tracking_uri(Path(config.train.run_dir))
    if config.tracking.mlflow_ui:
        ui = start_ui(mlflow_uri, Path(config.train.run_dir))
        print(f"[trainer] MLflow UI {ui.url} (pid {ui.pid}, left up: stop it with `kill {ui.pid}`)", flush=True)
    try:
        summary = train(config)
    except NonFiniteError as exc:  # nothing non-finite was applied or saved; say why the run stopped
        print(f"python -m miles.train: error: {str(exc).strip().splitlines()[-1]}", file=sys.stderr, flush=True)
        return 1
    except RedFlagStop as exc:  # --on-red-flag stop: checkpointed; a failed run, not a crash
        print(f"[trainer] stopped: {exc}", flush=True)
        return 1
    final = summary.final_metrics
    evals = {k: v for k, v in map_metrics(final).items() if k.startswith("eval/") and k != "eval/step"}
    base_eval = map_metrics(summary.base_eval)
    print(f"[trainer] done in {summary.seconds:.0f}s: rollouts {summary.first_rollout_id}..{summary.last_rollout_id}"
          f", checkpoint {summary.checkpoint}", flush=True)
    for key, value in evals.items():
        base = base_eval.get(key)
        print(f"  {key}: {value:.3f}" + (f" (base {base:.3f}, {value - base:+.3f})" if base is not None else ""))
    if config.tracking.use_mlflow and not config.tracking.mlflow_ui and not is_server_uri(mlflow_uri):
        print(f"  MLflow: {ui_command(mlflow_uri)}", flush=True)
    return 0


if __name__ == "__main__":
    from miles.config import run_main

    run_main(main, "python -m miles.train")
