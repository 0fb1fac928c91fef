"""A synthetic training loop that drives the tracker the way the trainer does (run as a process too).

Per rollout: log_rollout (samples), record (realistic Miles metrics), checkpoint every
`--save-interval` rollouts (a JSON file holding the checkpointed rollout and `checkpoint_extra`).
`--kill-at N` SIGKILLs itself after recording N; a rerun with the same run dir resumes from the
checkpoint file and redoes the rollouts after it (as the trainer does).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
from pathlib import Path

from miles.config import parse_config
from miles.rollout.sample import Sample, Status
from miles.tracking import open_tracking, validate_tracking_config

NUM_STEPS_PER_ROLLOUT = 2


def make_samples(rollout_id: int, n_groups: int = 2, group: int = 4) -> list[Sample]:
    out = []
    for g in range(n_groups):
        for j in range(group):
            a, b = rollout_id + g, 10 + j
            correct = (rollout_id + j) % 3 == 0 or g == 0
            reward = 1.0 if correct else 0.0
            out.append(Sample(index=len(out), group_index=g, prompt=f"{a}+{b}=", label=str(a + b),
                              response=str(a + b if correct else a + b + 1) + "<|im_end|>", response_length=3,
                              status=Status.TRUNCATED if j == 3 and g == 1 else Status.COMPLETED,
                              reward=reward, raw_reward=reward, rollout_log_probs=[-0.5, -1.0 - j, -0.25]))
    return out


def metrics_for(rollout_id: int) -> dict[str, float]:
    """Deterministic, realistic-looking values; `passrate/pass@4` exercises the key mapping."""
    x = rollout_id + 1
    m = {
        "train/loss": 0.5 / math.sqrt(x), "train/pg_loss": 0.4 / x, "train/entropy_loss": 1.2 - 0.01 * x,
        "train/pg_clipfrac": 0.05, "train/ppo_kl": 0.001 * x, "train/kl_loss": 0.002 * x,
        "train/train_rollout_logprob_abs_diff": 0.01, "train/grad_norm": 0.9 - 0.001 * x, "train/lr": 1e-6,
        "rollout/raw_reward": 0.3 + 0.01 * x, "rollout/rewards": 0.0, "rollout/advantages": 0.0,
        "rollout/log_probs": -1.5, "rollout/rollout_log_probs": -1.5, "rollout/ref_log_probs": -1.6,
        "rollout/response_lengths": 3.0, "rollout/truncated": 0.0, "rollout/entropy": 1.1,
        "passrate/pass@4": 0.5 + 0.001 * x,
        "perf/rollout_time": 1.5 + (os.getpid() % 997) / 1e4,  # differs in a redo, as timings do "perf/train_time": 2.0, "perf/actor_train_time": 1.8, "perf/log_probs_time": 0.2,
        "perf/update_weights_time": 0.3, "perf/step_time": 3.8, "perf/wait_time_ratio": 0.4,
        "perf/actor_train_tok_per_s": 1000.0 + x, "perf/tokens_per_gpu_per_sec": 900.0 + x,
        "train/step": float(rollout_id * NUM_STEPS_PER_ROLLOUT + NUM_STEPS_PER_ROLLOUT - 1),
        "rollout/step": float(rollout_id),
    }
    return m


def iterate(tracker, config, rollouts) -> None:
    """Log and record each rollout, as the trainer does."""
    args = config.as_namespace()
    for rollout_id in rollouts:
        tracker.log_rollout(rollout_id, args, make_samples(rollout_id), {}, 1.0)
        tracker.record(rollout_id, metrics_for(rollout_id))


def load_checkpoint(run_dir: Path) -> dict | None:
    path = run_dir / "checkpoint.json"
    return json.loads(path.read_text()) if path.exists() else None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--rollouts", type=int, default=6)
    parser.add_argument("--save-interval", type=int, default=2)
    parser.add_argument("--eval-interval", type=int, default=3)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--wait-trackers-open", action="store_true",
                        help="start the loop once every tracker run is open (so a kill lands mid-delivery)")
    args, miles_argv = parser.parse_known_args(argv)
    config = parse_config(["--num-rollout", str(args.rollouts), *miles_argv])
    validate_tracking_config(config)
    tracker = open_tracking(config, args.run_dir)
    ckpt = load_checkpoint(args.run_dir)
    tracker.open(ckpt["extra"] if ckpt else {})
    start = ckpt["rollout_id"] + 1 if ckpt else 0
    if args.wait_trackers_open:
        tracker.wait_open(120.0)
        print(f"delivery_pid={tracker.delivery.pid}", flush=True)  # tests follow it past a kill
    margs = config.as_namespace()
    for rollout_id in range(start, args.rollouts):
        tracker.log_rollout(rollout_id, margs, make_samples(rollout_id), {"rollout/extra_note": 1.0}, 1.5)
        metrics = metrics_for(rollout_id)
        if args.eval_interval and rollout_id % args.eval_interval == 0:
            data = {"arith": {"rewards": [1, 0, 1, 1], "truncated": [0, 0, 1, 0]}}
            tracker.log_eval(rollout_id, margs, data, {"eval/arith": 0.75, "eval/arith-truncated_ratio": 0.25})
        tracker.record(rollout_id, metrics)
        if args.kill_at is not None and rollout_id == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if (rollout_id + 1) % args.save_interval == 0 or rollout_id == args.rollouts - 1:
            (args.run_dir / "checkpoint.json").write_text(
                json.dumps({"rollout_id": rollout_id, "extra": tracker.checkpoint_extra()}))
    report = tracker.close()
    print(f"undelivered={json.dumps(report)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
