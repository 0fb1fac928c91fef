"""Does the tiny mixture-of-experts policy learn as the dense one does? One full default run of
configs/tiny-moe-cpu.yaml in the plain driver (the dense default's schedule: 100 rollouts of 32
prompts x 8 samples, an eval every 20), its held-out pass@1 gain against the dense default run's
recorded gain (docs/developer/default-run.json). The issue asks the two gains within 0.05.

    .venv/bin/python benchmarks/moe_learning.py                    # run it (the MoE base made)
    .venv/bin/python benchmarks/moe_learning.py --run-dir RUN_DIR   # read a finished run instead
    .venv/bin/python benchmarks/moe_learning.py -- --num-rollout 3  # extra flags for the run

A table, then the figures as one JSON object on the last line.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DENSE = ROOT / "docs/developer/default-run.json"
CONFIG = "configs/tiny-moe-cpu.yaml"
WITHIN = 0.05  # the bound on |MoE gain - dense gain|


def run(run_dir: Path, extra: list[str]) -> float:
    """The plain driver on the MoE config into `run_dir`; its wall seconds."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "miles.train", "--config", CONFIG,
                    "--run-dir", str(run_dir), *extra], cwd=ROOT, check=True)
    return time.monotonic() - start


def figures(run_dir: Path, wall: float | None) -> dict:
    sys.path.insert(0, str(ROOT))
    from miles.run.scorecard import scorecard

    card = scorecard(run_dir)
    dense = json.loads(DENSE.read_text())
    moe_gain, dense_gain = card.final_eval - card.base_eval, dense["final"] - dense["base"]
    trained = json.loads((card.checkpoint / "config.json").read_text()) if card.checkpoint else {}
    return {"run_dir": str(run_dir), "rollouts": card.iterations, "eval_key": card.eval_key,
            "moe_base": card.base_eval, "moe_final": card.final_eval,
            "moe_gain": round(moe_gain, 5),
            "dense_base": dense["base"], "dense_final": dense["final"],
            "dense_gain": round(dense_gain, 5), "dense_source": f"{DENSE.name} ({dense['commit']})",
            "gain_difference": round(moe_gain - dense_gain, 5),
            "within_bound": abs(moe_gain - dense_gain) <= WITHIN,
            "reward_first": card.reward_first[1], "reward_last": card.reward_last[1],
            "wall_seconds": None if wall is None else round(wall, 1),
            "training_seconds": card.journal_seconds,
            "model_type": trained.get("model_type"),
            "num_experts": trained.get("num_local_experts"),
            **_layout(run_dir)}


def _layout(run_dir: Path) -> dict:
    """The run's model and training layout, from the config it recorded (tracking/config.yaml)."""
    import yaml

    path = run_dir / "tracking/config.yaml"
    config = yaml.safe_load(path.read_text()) if path.exists() else {}
    keys = ("hf_checkpoint", "train_backend", "actor_num_gpus_per_node",
            "expert_model_parallel_size")
    return {k: config.get(k) for k in keys}


def table(f: dict) -> str:
    rows = [("policy", "base pass@1", "final pass@1", "gain"),
            ("dense (recorded)", f"{f['dense_base']:.3f}", f"{f['dense_final']:.3f}",
             f"{f['dense_gain']:+.3f}"),
            ("moe (this run)", f"{f['moe_base']:.3f}", f"{f['moe_final']:.3f}",
             f"{f['moe_gain']:+.3f}")]
    lines = ["  ".join(f"{c:<16}" for c in r) for r in rows]
    lines.append(f"gain difference {f['gain_difference']:+.3f} (bound +-{WITHIN}: "
                 f"{'within' if f['within_bound'] else 'outside'}); {f['rollouts']} rollouts, "
                 f"reward {f['reward_first']:.3f} -> {f['reward_last']:.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", type=Path, help="read this finished run instead of running one")
    ap.add_argument("extra", nargs="*", help="flags passed to the run (after --)")
    args = ap.parse_args(argv)
    wall = None
    run_dir = args.run_dir
    if run_dir is None:
        run_dir = ROOT / "runs" / time.strftime("moe-%Y%m%d-%H%M%S")
        wall = run(run_dir, args.extra)
    f = figures(run_dir.resolve(), wall)
    print(table(f))
    print(json.dumps(f))
    return 0


if __name__ == "__main__":
    sys.exit(main())
