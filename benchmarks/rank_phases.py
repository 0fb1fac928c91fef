"""What the per-rank phase spans cost a training step: the FSDP ranks with their recorder on (spans,
the marks after the log-probs, each forward and backward pass and before the gradient reduction
that the group settles into waits, a device synchronize per span on a GPU) against the same ranks
with it off, side by side. The ranks get a run dir, as in a run, so each also runs its announcing
thread (rank_activity.py: a phase of over a second is written to RUN_DIR/collectives), on both
sides.

    .venv/bin/python benchmarks/rank_phases.py [--ranks 2] [--rounds 8]

One group of `--ranks` FSDP ranks (Ray actors) on the default config's tiny model and batch shape
(`miles.backends.rank_phases`); each round trains one synthetic rollout three times: with the
recorder on, off, and off again (the order rotates, so a noisy neighbour hits all alike; round 0
warms up and is not counted). The second off side is the control: its difference from the first is
what the machine's noise alone shows, and an overhead below it is not resolved. Step time is the
driver's wall time of `ActorGroup.train`. Beside it, the recorder's own cost measured in process
(`timeit` of a span and a mark) times the spans and marks of a step: a bound from the parts.
Prints a table, then one JSON line with the medians, the overhead ratio of the medians (goal:
<= 1%), the control's ratio, the median of each round's own on/off ratio (its steps ran back to
back, so the load's drift between rounds cancels) and the bound from the parts.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import timeit
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
    sides = (("on", True), ("off", False), ("control", False))
    seconds: dict[str, list[float]] = {name: [] for name, _ in sides}
    spans = waits = marks = 0
    try:
        for r in range(rounds + 1):  # round 0 warms every side up and is not counted
            samples, advantages = synthetic_rollout(config, seed=r)
            batches = split_for_ranks(samples, advantages, config.global_batch_size,
                                      config.world_size, rollout_id=r)
            for name, enabled in sides[r % 3:] + sides[:r % 3]:
                took, results = timed_step(group, batches, enabled)
                if r:
                    seconds[name].append(took)
                if enabled:
                    recorded = results[0].rank_spans.spans
                    waits = sum(kind == "wait" for _, kind, _, _ in recorded)
                    spans = len(recorded) - waits
                    marks = ray.get(group.actors[0].__ray_call__.remote(
                        lambda rank: rank.rank_phases.arrivals))
    finally:
        group.stop()
        ray.shutdown()
    median = {name: statistics.median(values) for name, values in seconds.items()}
    # each round's steps ran back to back: their ratio leaves out the load's drift over rounds
    paired = [a / b - 1.0 for a, b in zip(seconds["on"], seconds["off"])]
    per_step_s = recorder_cost_s() * max(spans, marks)
    return {"ranks": config.world_size, "rounds": rounds, "step_s_with": median["on"],
            "step_s_without": median["off"], "step_s_control": median["control"],
            "overhead": median["on"] / median["off"] - 1.0,
            "control": median["control"] / median["off"] - 1.0,
            "overhead_paired": statistics.median(paired), "overhead_rounds": paired,
            "spans_per_rank": spans, "marks_per_rank": marks, "waits_per_rank": waits,
            "recorder_s_per_step": per_step_s, "overhead_from_parts": per_step_s / median["off"]}


def recorder_cost_s(number: int = 20000) -> float:
    """Seconds of one span and one mark on a rank's thread (in this process, no GPU)."""
    from miles.backends.rank_phases import RankPhaseRecorder
    from miles.run.stragglers import RankCoords

    rec = RankPhaseRecorder(RankCoords(0, 0))
    rec.begin(0)

    def one():
        with rec.span("forward"):
            pass
        rec.arrive("forward")

    return timeit.timeit(one, number=number) / number


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
    print(f"{'training step, ' + str(out['ranks']) + ' FSDP ranks':<34}{'seconds (median)':>18}")
    print(f"{'with the rank-phase recorder':<34}{out['step_s_with']:>18.3f}")
    print(f"{'without':<34}{out['step_s_without']:>18.3f}")
    print(f"{'without, again (the control)':<34}{out['step_s_control']:>18.3f}")
    print(f"{'overhead':<34}{out['overhead']:>18.2%}   (goal: <= 1%)")
    print(f"{'the control against without':<34}{out['control']:>18.2%}   (the noise floor)")
    rounds = out["overhead_rounds"]
    print(f"{'per round (on/off - 1), median':<34}{out['overhead_paired']:>18.2%}   "
          f"(rounds {min(rounds):+.1%} to {max(rounds):+.1%})")
    print(f"{'from the parts (spans x cost)':<34}{out['overhead_from_parts']:>18.3%}   "
          f"({out['recorder_s_per_step'] * 1e6:.0f} us a step)")
    print(f"{'spans / marks / waits per rank':<34}{out['spans_per_rank']:>10} / "
          f"{out['marks_per_rank']} / {out['waits_per_rank']}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
