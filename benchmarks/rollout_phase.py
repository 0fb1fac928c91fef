"""The rollout phase of real runs against one batched generate, as issue 55 measures it: the median
`perf/rollout_time` of rollouts 1..N-1 in the journal of `python -m miles.train --num-rollout N`
(rollout 0 pays for first-call allocations) over the in-process limit, one batched HF `generate` of
the same 256 samples (benchmarks/rollout.py's), measured in the same sitting just before and after
each run. Goal: <= 1.5x in every run.

    .venv/bin/python benchmarks/rollout_phase.py [--runs 3] [--num-rollout 8] [--reps 5]
                                                 [-- run flags]

Where the time goes, from each run's timeline (the engine writes one `decode` span per stretch of
back-to-back batches, with the number of prefill groups it admitted in `args.batches`):
- `to engine`: rollout start to the engine's first batch (prompts, the client, the router, the
  engine's HTTP front end and queue);
- `engine`: the engine's stretch of batches (prefills and decode steps), and `groups`, how many
  prefill groups the 256 samples reached it in (one is the in-process limit's shape);
- `after`: the engine's last batch to the rollout's end (the last replies, rewards, advantages).
`to cpu` is the rollout over the limit's CPU seconds: on an idle host it equals the ratio; on a busy
one the limit's wall time swings with the load of the moment (the kernel shares the CPU by session),
and the two ratios bracket the figure. Prints a table, then one JSON line with every run's figures.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def limit_seconds(reps: int) -> tuple[float, float]:
    """The in-process limit: the medians of `reps` batched generates of the default rollout, wall
    seconds and CPU seconds (one torch thread: wall well above CPU says the host was contended)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.rollout import in_process_seconds
    from miles.config import EngineConfig, RolloutConfig
    from miles.rollout.data import read_prompts
    from miles.rollout.generate import encode_prompt
    from miles.tiny.warmstart import default_task_data, ensure_base_model

    engine, rollout = EngineConfig(engine_device="cpu"), RolloutConfig()
    torch.set_num_threads(engine.engine_cpu_threads)  # the engine's torch threads
    model_dir = ensure_base_model(progress=False)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompts = read_prompts(default_task_data()[0], "prompt", "label")[:rollout.rollout_batch_size]
    ids = [encode_prompt(tokenizer, p.prompt, False) for p in prompts]
    samples = [i for i in ids for _ in range(rollout.n_samples_per_prompt)]
    new_tokens = rollout.rollout_max_response_len
    in_process_seconds(model, tokenizer, samples, new_tokens, 1.0, False)  # warm-up
    walls, cpus = [], []
    for _ in range(reps):
        cpu = time.process_time()
        walls.append(in_process_seconds(model, tokenizer, samples, new_tokens, 1.0, False)[0])
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def where_time_goes(run_dir: Path, rollout_ids: range) -> dict[str, float]:
    """Medians over `rollout_ids` of the rollout's parts (see the module doc), from the timeline."""
    spans = [json.loads(line) for line in (run_dir / "timeline.jsonl").read_text().splitlines()]
    rollouts = {s["rollout_id"]: s for s in spans
                if s["lane"] == "trainer" and s["name"] == "rollout"}
    batches = [s for s in spans if s["lane"].startswith("engine") and s["name"] == "decode"]
    parts: dict[str, list[float]] = {"to_engine_s": [], "engine_s": [], "after_s": [], "groups": []}
    for rid in rollout_ids:
        r = rollouts[rid]
        inside = [s for s in batches if s["start"] < r["end"] and s["end"] > r["start"]]
        if not inside:
            continue
        first, last = min(s["start"] for s in inside), max(s["end"] for s in inside)
        parts["to_engine_s"].append(first - r["start"])
        parts["engine_s"].append(last - first)
        parts["after_s"].append(r["end"] - last)
        parts["groups"].append(sum(int(s.get("args", {}).get("batches", 1)) for s in inside))
    return {k: statistics.median(v) for k, v in parts.items() if v}


def one_run(run_dir: Path, num_rollout: int, flags: list[str]) -> tuple[float, float]:
    """Train `num_rollout` rollouts with the plain driver; (wall seconds, median
    perf/rollout_time of rollouts 1..N-1)."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "miles.train", "--num-rollout", str(num_rollout),
                    "--run-dir", str(run_dir), *flags], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.monotonic() - start
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = [ln["perf/rollout_time"] for ln in lines
             if ln["rollout_id"] >= 1 and "perf/rollout_time" in ln]
    return wall, statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs, each between two limit measurements")
    ap.add_argument("--num-rollout", type=int, default=8,
                    help="rollouts per run (the median skips 0)")
    ap.add_argument("--reps", type=int, default=5, help="batched generates per limit measurement")
    ap.add_argument("flags", nargs="*", help="run flags after --, passed to python -m miles.train")
    args = ap.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="rollout-phase-") as tmp:
        for i in range(args.runs):
            before = limit_seconds(args.reps)
            run_dir = Path(tmp) / f"run-{i}"
            wall, rollout = one_run(run_dir, args.num_rollout, args.flags)
            after = limit_seconds(args.reps)
            limit, cpu = (statistics.mean(pair) for pair in zip(before, after))
            results.append({"run": i, "rollout_s": rollout, "limit_s": limit, "limit_cpu_s": cpu,
                            "ratio": rollout / limit, "ratio_to_cpu": rollout / cpu, "wall_s": wall,
                            **where_time_goes(run_dir, range(1, args.num_rollout))})
    print(f"{'run':>4}{'rollout s':>11}{'limit s':>10}{'(cpu s)':>9}{'ratio':>8}{'to cpu':>8}"
          f"{'to engine':>11}{'engine':>9}{'after':>8}{'groups':>8}")
    for r in results:
        print(f"{r['run']:>4}{r['rollout_s']:>11.3f}{r['limit_s']:>10.3f}{r['limit_cpu_s']:>9.3f}"
              f"{r['ratio']:>7.2f}x{r['ratio_to_cpu']:>7.2f}x"
              f"{r.get('to_engine_s', 0):>11.3f}{r.get('engine_s', 0):>9.3f}"
              f"{r.get('after_s', 0):>8.3f}"
              f"{r.get('groups', 0):>8.1f}")
    worst = max(r["ratio"] for r in results)
    print(f"worst run: {worst:.2f}x the in-process limit (goal <= 1.5x in every run); a limit "
          f"whose wall time is well above its CPU time was measured on a contended host")
    print(json.dumps({"runs": [{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}
                               for r in results], "worst_ratio": round(worst, 4),
                      "num_rollout": args.num_rollout, "reps": args.reps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
