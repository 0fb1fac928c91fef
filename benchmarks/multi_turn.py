"""Multi-turn learning: the tiny calculator run (`configs/tiny-multi-turn.yaml`) with the plain loop,
held-out pass@1 and tool use at the start against the end, side by side in one run.

The base eval is the warm-started policy's (before any RL step); the final eval is after the
last rollout, on the same held-out prompts with the same seeds. Tool use is
`multi_turn/tool_use_ratio` (share of trajectories that called a tool), first rollout
against the mean of the last three. Prints a table, then one JSON line.

    .venv/bin/python benchmarks/multi_turn.py [--num-rollout N] [more flags for the run...]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, default=None)
    args, flags = parser.parse_known_args()

    from miles.config import parse_config
    from miles.record.journal import read_journal
    from miles.tiny.tool_warmstart import ensure_tool_model
    from miles.prepare import prepare_config
    from miles.train import train

    start = time.perf_counter()
    ensure_tool_model(progress=False)
    warm_start_s = time.perf_counter() - start
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="miles-multi-turn-"))
    config = parse_config(["--config", str(ROOT / "configs" / "tiny-multi-turn.yaml"), "--run-dir", str(run_dir),
                           *flags])
    prepared, start = prepare_config(config), time.perf_counter()
    train(prepared)
    run_s = time.perf_counter() - start  # the whole run: Ray, engines, ranks, every rollout
    journal = read_journal(run_dir / "metrics.jsonl")
    lines = [ln.metrics for ln in journal if ln.rollout_id >= 0]  # iterations (the base eval's line is -1)
    evals = [ln.metrics for ln in journal if any(k.endswith("-pass_at_1") for k in ln.metrics)]
    key = next(k for k in evals[0] if k.endswith("-pass_at_1"))
    base, final = evals[0][key], evals[-1][key]
    tool_first = lines[0]["multi_turn/tool_use_ratio"]
    tool_last = sum(m["multi_turn/tool_use_ratio"] for m in lines[-3:]) / len(lines[-3:])
    turns_first = lines[0]["multi_turn/round_number_mean"]
    turns_last = sum(m["multi_turn/round_number_mean"] for m in lines[-3:]) / len(lines[-3:])
    diff0 = lines[0]["train/train_rollout_logprob_abs_diff"]

    rows = [("held-out pass@1", base, final), ("tool use ratio", tool_first, tool_last),
            ("turns per trajectory", turns_first, turns_last)]
    print(f"{'metric':<24}{'start':>10}{'end':>10}")
    for name, a, b in rows:
        print(f"{name:<24}{a:>10.3f}{b:>10.3f}")
    print(f"rollouts {len(lines)}, run {run_s:.0f}s (warm start {warm_start_s:.0f}s if made), "
          f"logprob abs diff at rollout 0 {diff0:.2e}")
    print(json.dumps({"eval_pass_at_1_base": base, "eval_pass_at_1_final": final, "pass_at_1_lift": final - base,
                      "tool_use_first": tool_first, "tool_use_last3": tool_last, "turns_first": turns_first,
                      "turns_last3": turns_last, "logprob_abs_diff_rollout0": diff0, "run_s": run_s,
                      "warm_start_s": warm_start_s, "rollouts": len(lines), "run_dir": str(run_dir)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
