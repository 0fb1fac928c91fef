"""What a dead engine costs a supervised run (`--use-fault-tolerance`): the time from its death to its
readmission at the current weights, and the rollout time lost, against the same run with no fault.

    .venv/bin/python benchmarks/engine_faults.py [--num-rollout 4] [--fault kill-engine:1@1] [any run flags]

Two plain runs (`python -m miles.train`'s `train()`, the default tiny config, two engines, trackers off),
one after the other on the same machine: a clean one, and one where `--fault` hits an engine while its
rollout is in flight. Read off each run's own files:
- down -> readmitted: the supervisor's `engine_restart` span (from the moment it saw the engine down to
  its admission at the current weight version), with the relaunch (process start to /health_generate)
  inside it; the kill itself happens at most one --engine-health-interval before "down";
- rollout time lost: the sum of perf/rollout_time over the run, fault minus clean, and the same for the
  faulted rollout alone; rollouts redone (journal lines beyond one per rollout) and requests re-sent.
The last line is one JSON object with the figures.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

QUICK = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--micro-batch-size", "8",
         "--eval-interval", "1000", "--rollout-num-engines", "2", "--use-fault-tolerance",
         "--engine-health-interval", "0.5", "--engine-health-timeout", "1", "--engine-restart-backoff", "0.2",
         ]


def one_run(run_dir: Path, num_rollout: int, fault: str | None, extra: list[str]) -> dict:
    from miles.config import parse_config
    from miles.prepare import prepare_config
    from miles.record.journal import read_journal
    from miles.record.timeline import read_spans
    from miles.train import train

    argv = [*QUICK, "--num-rollout", str(num_rollout), "--run-dir", str(run_dir), *extra]
    if fault:
        argv += ["--inject-fault", fault]
    start = time.perf_counter()
    summary = train(prepare_config(parse_config(argv)))
    wall = time.perf_counter() - start
    lines = [ln for ln in read_journal(run_dir / "metrics.jsonl") if ln.rollout_id >= 0]
    spans = [s for s in read_spans(run_dir / "timeline.jsonl") if s.lane == "engines"]
    restart = next((s for s in spans if s.name == "engine_restart"), None)
    relaunch = next((s for s in spans if s.name == "engine_relaunch"), None)
    rollout_times = {ln.rollout_id: ln.metrics["perf/rollout_time"] for ln in lines}
    return {
        "wall_s": wall,
        "rollout_time_s": sum(rollout_times.values()),
        "rollout_times": rollout_times,
        "journal_lines": len(lines), "rollouts": num_rollout,
        "requests_resent": sum(ln.metrics.get("rollout/requests_resent", 0.0) for ln in lines),
        "engine_restarts": sum(ln.metrics.get("rollout/engine_restarts", 0.0) for ln in lines),
        "down_to_readmitted_s": None if restart is None else restart.end - restart.start,
        "relaunch_s": None if relaunch is None else relaunch.end - relaunch.start,
        "readmitted_at_version": None if restart is None else restart.args.get("weight_version"),
        "engine_versions": summary.engine_versions,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-rollout", type=int, default=4)
    parser.add_argument("--fault", default="kill-engine:1@1")
    args, extra = parser.parse_known_args(argv)
    from miles.run.faults import parse_fault

    faulted = parse_fault(args.fault).rollout_id
    import ray

    ray.init(num_cpus=2, namespace="miles", include_dashboard=False, log_to_driver=False,
             object_store_memory=128 * 1024 * 1024)
    try:
        with tempfile.TemporaryDirectory(prefix="miles-engine-faults-") as tmp:
            clean = one_run(Path(tmp) / "clean", args.num_rollout, None, extra)
            fault = one_run(Path(tmp) / "fault", args.num_rollout, args.fault, extra)
    finally:
        ray.shutdown()

    lost_total = fault["rollout_time_s"] - clean["rollout_time_s"]
    lost_faulted = fault["rollout_times"][faulted] - clean["rollout_times"][faulted]
    redone = fault["journal_lines"] - fault["rollouts"]
    rows = [
        ("wall time of the run (s)", clean["wall_s"], fault["wall_s"]),
        ("sum of perf/rollout_time (s)", clean["rollout_time_s"], fault["rollout_time_s"]),
        (f"perf/rollout_time of rollout {faulted} (s)", clean["rollout_times"][faulted],
         fault["rollout_times"][faulted]),
        ("rollouts redone", clean["journal_lines"] - clean["rollouts"], redone),
        ("requests re-sent", clean["requests_resent"], fault["requests_resent"]),
        ("engine restarts", clean["engine_restarts"], fault["engine_restarts"]),
    ]
    print(f"{'':40s} {'clean':>10s} {args.fault:>16s}")
    for name, a, b in rows:
        print(f"{name:40s} {a:10.2f} {b:16.2f}")
    print(f"down -> readmitted: {fault['down_to_readmitted_s']:.1f} s (relaunch {fault['relaunch_s']:.1f} s), "
          f"readmitted at weight version {fault['readmitted_at_version']}; engines at the end: "
          f"{fault['engine_versions']}")
    print(json.dumps({
        "fault": args.fault, "num_rollout": args.num_rollout,
        "down_to_readmitted_s": round(fault["down_to_readmitted_s"], 2),
        "relaunch_s": round(fault["relaunch_s"], 2),
        "readmitted_at_version": fault["readmitted_at_version"],
        "rollout_time_lost_s": round(lost_total, 2), "faulted_rollout_time_lost_s": round(lost_faulted, 2),
        "wall_time_lost_s": round(fault["wall_s"] - clean["wall_s"], 2),
        "rollouts_redone": redone, "requests_resent": fault["requests_resent"],
        "engine_versions_at_end": fault["engine_versions"],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
