"""`python -m miles.train [flags]`: the whole GRPO loop in one process, no Prefect (Miles' train.py).

With no flags it trains the tiny CPU policy on the arithmetic task: resolve and check the
flags, connect Ray, start the engines and router on loopback, then `miles.loop.run_loop`
over every rollout (the Prefect flow runs the same loop in chunks). RUN_DIR gets
checkpoints, metrics.jsonl and the logs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from miles.config import MilesConfig, parse_config


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


def train(config: MilesConfig, use_router: bool = True, observers=()) -> RunSummary:
    from miles.cluster.ray_connect import connect_ray, disconnect_ray
    from miles.config.resolve import resolve
    from miles.faults import FaultInjector
    from miles.inference import start_inference
    from miles.loop import run_loop
    from miles.preflight import preflight
    from miles.trainer import RLTrainer

    config = resolve(config)
    preflight(config)  # a bad hook or data path fails here, before Ray, engines or ranks start
    start = time.time()
    cluster = connect_ray(config.orchestration)
    services = None
    try:
        services = start_inference(config, use_router=use_router)
        trainer = RLTrainer(config, services.rollout_url, services.engine_urls)
        fault = FaultInjector(config.orchestration.inject_fault, config.train.run_dir,
                              kill_engine=lambda: services.kill_engine(0))
        outcome = run_loop(trainer, range(config.rollout.num_rollout), [fault, *observers])
        last = outcome.rollout_ids[-1] if outcome.rollout_ids else outcome.resumed_at - 1
        return RunSummary(Path(config.train.run_dir), outcome.resumed_at, last, outcome.checkpoint,
                          outcome.base_eval, outcome.last_metrics, time.time() - start, outcome.stop_reason)
    finally:
        try:
            if services is not None:
                services.stop()
        finally:
            if cluster.started_here:
                disconnect_ray()


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv, prog="python -m miles.train")
    summary = train(config)
    final = summary.final_metrics
    evals = {k: v for k, v in final.items() if k.startswith("eval/") and k != "eval/step"}
    print(f"[trainer] done in {summary.seconds:.0f}s: rollouts {summary.first_rollout_id}..{summary.last_rollout_id}"
          f", checkpoint {summary.checkpoint}" + (f", stopped: {summary.stop_reason}" if summary.stop_reason else ""),
          flush=True)
    for key, value in evals.items():
        base = summary.base_eval.get(key)
        print(f"  {key}: {value:.3f}" + (f" (base {base:.3f}, {value - base:+.3f})" if base is not None else ""))
    return 0


if __name__ == "__main__":
    from miles.config import run_main

    run_main(main, "python -m miles.train")
