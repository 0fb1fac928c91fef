"""What the per-rank phase spans cost a training step: the FSDP ranks with their recorder on (spans,
the timed barriers after the log-probs, each forward and backward pass and before the gradient
reduction, a device synchronize per span on a GPU) against the same ranks with it off, side by side.
The ranks get a run dir, as in a run, so each also runs its announcing thread (rank_activity.py:
a phase of over a second is written to RUN_DIR/collectives), on both sides.

    .venv/bin/python benchmarks/rank_phases.py [--ranks 2] [--rounds 8]

One group of `--ranks` FSDP ranks (Ray actors) on the default config's tiny model and batch shape
(`miles.backends.rank_phases`); each round trains one synthetic rollout twice, once with the
recorder on and once off (the order alternates, so a noisy neighbour hits both alike; round 0 warms
up and is not counted). Step time is the driver's wall time of `ActorGroup.train`. Prints a table,
then one JSON line with the medians, the overhead ratio of the medians (goal: <= 1%) and the median
of each round's own on/off ratio (its two steps ran back to back, so the load's drift between rounds
cancels).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.train import synthetic_rollout  # noqa: E402  (the same rollout-shaped batch)


def set_recorder(group, enabled: bool) -> None:
    import ray

    def switch(rank, on):
        rank.rank_phases.enabled = on

    ray.get([a.__ray_call__.remote(switch, enabled) for a in group.actors])


def timed_step(group, batches, enabled: bool) -> tuple[float, list]:
    set_recorder(group, enabled)
    start = time.perf_counter()
    results = group.train(batches)
    return time.perf_counter() - start, results


def bench(config, model_path: str, rounds: int) -> dict:
    import ray

    from miles.backends.group import ActorGroup
    from miles.backends.pack import split_for_ranks

    ray.init(include_dashboard=False, log_to_driver=False, namespace="miles")
    group = ActorGroup(config, model_path)
    seconds: dict[bool, list[float]] = {True: [], False: []}
    spans = waits = 0
    try:
        for r in range(rounds + 1):  # round 0 warms both up and is not counted
            samples, advantages = synthetic_rollout(config, seed=r)
            batches = split_for_ranks(samples, advantages, config.global_batch_size,
                                      config.world_size, rollout_id=r)
            for enabled in ((True, False) if r % 2 else (False, True)):
                took, results = timed_step(group, batches, enabled)
                if r:
                    seconds[enabled].append(took)
                if enabled:
                    recorded = results[0].rank_spans.spans
                    spans, waits = len(recorded), sum(kind == "wait" for _, kind, _, _ in recorded)
    finally:
        group.stop()
        ray.shutdown()
    on, off = statistics.median(seconds[True]), statistics.median(seconds[False])
    # each round's two steps ran back to back: their ratio leaves out the load's drift over rounds
    paired = [a / b - 1.0 for a, b in zip(seconds[True], seconds[False])]
    return {"ranks": config.world_size, "rounds": rounds, "step_s_with": on, "step_s_without": off,
            "overhead": on / off - 1.0, "overhead_paired": statistics.median(paired),
            "overhead_rounds": paired, "spans_per_rank": spans, "waits_per_rank": waits}


def main(argv=None) -> int:
    from miles.config import parse_config
    from miles.prepare import prepare_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2,
                        help="FSDP ranks (--actor-num-gpus-per-node)")
    parser.add_argument("--rounds", type=int, default=8, help="timed rounds per side")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as run_dir:  # a run dir, as in a run: the ranks announce
        config = parse_config(["--actor-num-gpus-per-node", str(args.ranks), "--run-dir", run_dir])
        model_path = prepare_config(config).rollout.hf_checkpoint  # the tiny base model
        out = bench(config, model_path, args.rounds)
    print(f"{'training step, ' + str(out['ranks']) + ' FSDP ranks':<32}{'seconds (median)':>18}")
    print(f"{'with the rank-phase recorder':<32}{out['step_s_with']:>18.3f}")
    print(f"{'without':<32}{out['step_s_without']:>18.3f}")
    print(f"{'overhead':<32}{out['overhead']:>18.2%}   (goal: <= 1%)")
    rounds = out["overhead_rounds"]
    print(f"{'per round (on/off - 1), median':<32}{out['overhead_paired']:>18.2%}   "
          f"(rounds {min(rounds):+.1%} to {max(rounds):+.1%})")
    spans, waits = out["spans_per_rank"], out["waits_per_rank"]
    print(f"{'spans / waits per rank and step':<32}{spans:>12} / {waits}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
