"""OpenMP's wait policy for torch threads that share cores: spinning (libgomp's default) against passive
waiting (what miles gives its engines and Ray workers, `miles.serving.process.passive_omp`), side by side.

    .venv/bin/python benchmarks/omp_wait.py [--steps 60] [--repeats 3] [--threads N]

Each case is a fresh process taking `--steps` training steps of the tiny policy (forward, backward, AdamW)
with `--threads` torch threads (default: every core, as a rank alone on a node gets), alone or beside a
busy loop that holds one core (another worker, an engine decoding, a second job). The cases run
interleaved, `--repeats` times, and each is reported by its median milliseconds per step. Prints a table,
then one JSON line: the medians and, alone and beside the busy loop, spin / passive.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STEPS = r"""
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
from miles.tiny import warmstart as W
from miles.tiny.sft import token_ids
from miles.tiny.model import build_tiny_model
from miles.tiny.task import split_problems
recipe = W.RECIPE
train, _ = split_problems(recipe["seed"])
model, tokenizer = build_tiny_model(0)
optimizer = torch.optim.AdamW(model.parameters(), lr=recipe["lr"], weight_decay=0.0)
ids, generator = token_ids(tokenizer), torch.Generator().manual_seed(0)
def step():
    picked = torch.randint(len(train), (recipe["batch_size"],), generator=generator)
    loss = W.smoothed_loss(model, *W._encode(tokenizer, [train[i] for i in picked], ids))
    optimizer.zero_grad(set_to_none=True); loss.backward(); optimizer.step()
step()  # the first step allocates: not timed
start = time.perf_counter()
for _ in range(int(sys.argv[2])):
    step()
print((time.perf_counter() - start) / int(sys.argv[2]) * 1000)
"""
BUSY_LOOP = "while True: pass"


def ms_per_step(threads: int, steps: int, policy: str | None, beside_busy: bool) -> float:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    busy = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if beside_busy else None
    try:
        done = subprocess.run([sys.executable, "-c", STEPS, str(threads), str(steps)], env=env, cwd=ROOT,
                              capture_output=True, text=True, check=True)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    return float(done.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    cases = [(name, policy, busy) for busy in (False, True) for name, policy in (("spin", None), ("passive", "PASSIVE"))]
    times: dict[str, list[float]] = {f"{name}{'+busy' if busy else ''}": [] for name, _, busy in cases}
    for repeat in range(args.repeats):
        for name, policy, busy in cases:
            key = f"{name}{'+busy' if busy else ''}"
            times[key].append(ms_per_step(args.threads, args.steps, policy, busy))
            print(f"  repeat {repeat + 1}/{args.repeats} {key}: {times[key][-1]:.1f} ms/step", file=sys.stderr)
    median = {k: statistics.median(v) for k, v in times.items()}
    print(f"{'case':<14} {'ms/step (median)':>17} {'runs':>30}")
    for key, values in times.items():
        print(f"{key:<14} {median[key]:>17.1f} {', '.join(f'{v:.1f}' for v in values):>30}")
    ratios = {"alone_spin_over_passive": median["spin"] / median["passive"],
              "beside_busy_spin_over_passive": median["spin+busy"] / median["passive+busy"]}
    print(f"spin / passive: alone {ratios['alone_spin_over_passive']:.2f}, "
          f"beside a busy core {ratios['beside_busy_spin_over_passive']:.2f}")
    print(json.dumps({"threads": args.threads, "steps": args.steps, "repeats": args.repeats,
                      "ms_per_step": median, **ratios}))


if __name__ == "__main__":
    main()
