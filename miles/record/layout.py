"""The run directory as a schema: every file and folder a run writes, named once, with who writes it.

RUN_DIR is the protocol between the trainer, the tracker delivery process, the health watch, the
dashboard, `miles doctor` and the flow: each reads what another wrote, often from another process
or after a crash. So the names live here and nowhere else; writers and readers take them from this
module (`RunLayout(run_dir).journal`, or the relative names below for code that joins them itself).
The "Where the log files live" table of docs/user-guide/monitoring.md is checked against `ENTRIES` by the tests.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Entry:
    """One file (or folder, `path` ending in "/") of RUN_DIR, relative to it."""

    path: str
    writer: str
    what: str


ENTRIES: dict[str, Entry] = dict([
    ("journal", Entry("metrics.jsonl", "trainer", "one JSON line per iteration: the source of truth of every tracker")),
    ("health", Entry("health.jsonl", "health watch", "one line per flag per rollout")),
    ("timeline", Entry("timeline.jsonl", "trainer, ranks, engines, router", "the phase timeline (spans)")),
    ("timeline_open", Entry("timeline-open.jsonl", "trainer", "phase starts: one with no span in timeline.jsonl is still open")),
    ("base_eval", Entry("base_eval.json", "trainer", "the eval of the starting weights")),
    ("report", Entry("report.png", "tracker", "the run report's curves")),
    ("samples", Entry("samples/", "tracker", "sample tables, rollout_NNNNNN.jsonl")),
    ("eval_prompts", Entry("samples/eval/", "tracker", "per-prompt eval results, base.jsonl and rollout_NNNNNN.jsonl")),
    ("tokens", Entry("tokens/", "trainer", "per-token data of the logged samples, rollout_NNNNNN.jsonl")),
    ("tracking_config", Entry("tracking/config.yaml", "tracker", "the redacted config: tracker params")),
    ("trainer_state", Entry("tracking/trainer.json", "tracker", "what the trainer asks of the delivery process")),
    ("redone", Entry("tracking/redone.jsonl", "tracker", "journal lines of rollouts redone after a crash")),
    ("delivery_state", Entry("tracking/delivery.json", "delivery process", "cursors and run ids per tracker")),
    ("delivery_lock", Entry("tracking/delivery.lock", "delivery process", "one delivery process per run")),
    ("delivery_log", Entry("tracking/delivery.log", "delivery process", "tracker failures, recoveries, run ids")),
    ("logs", Entry("logs/", "engines, router, MLflow UI", "engine-<i>.log, router.log, mlflow-ui.log")),
    ("profiler", Entry("profiler/", "profiler", "profiling windows' traces (unless --tensorboard-dir)")),
    ("profiler_summaries", Entry("profiler/summaries.jsonl", "profiler", "one line per window, target and rank")),
    ("profiler_requested", Entry("profiler/requested_windows.jsonl", "profiler", "windows asked for while training")),
    ("profiler_processes", Entry("profiler/processes.json", "profiler", "the run's pids, for py-spy")),
    ("py_spy", Entry("profiler/py-spy/", "profiler", "py-spy dumps, <time>/<process>-<pid>.txt")),
    ("ray_timeline", Entry("profiler/ray-timeline.json", "profiler", "ray.timeline() of the run or chunk")),
    ("services", Entry("profiler/services.json", "profiler", "the run's Ray cluster, engine and router URLs, for diagnose")),
    ("diagnose", Entry("diagnose/", "miles diagnose, stall watch", "diagnose bundles, diagnose-<time>.tar.gz")),
    ("checkpoints", Entry("checkpoints/", "trainer", "iter_NNNNNNN checkpoints (the default --save)")),
    ("weights", Entry("weights/", "trainer", "weights staged for the engines (weight sync from disk)")),
    ("faults", Entry("faults/", "--inject-fault", "markers of faults already fired")),
    ("collectives", Entry("collectives/", "training ranks",
                          "rank-<N>.json: the weight-push collective "
                          "each rank is in, train-rank-<N>.json: its training phase of over a "
                          "second, with a heartbeat (whom a stuck collective waits for)")),
    ("lock", Entry(".lock", "trainer", "one trainer per run dir")),
    ("mlflow_db", Entry("mlflow.db", "MLflow sink", "a run's own MLflow store (--mlflow-tracking-uri "
                        "sqlite:///RUN_DIR/mlflow.db; by default the runs in one folder share FOLDER/mlflow.db)")),
    ("mlartifacts", Entry("mlartifacts/", "MLflow sink", "MLflow artifacts beside a SQLite store, a folder per run")),
    ("tensorboard", Entry("tensorboard/", "TensorBoard sink", "event files (the default --tensorboard-dir)")),
    ("wandb", Entry("wandb/", "wandb sink", "wandb's local run files (the default --wandb-dir is RUN_DIR)")),
])


def _name(key: str) -> str:
    return ENTRIES[key].path.rstrip("/")


# Relative names, for modules that join them to a run dir they hold.
JOURNAL = _name("journal")
HEALTH = _name("health")
TIMELINE = _name("timeline")
TIMELINE_OPEN = _name("timeline_open")
BASE_EVAL = _name("base_eval")
REPORT = _name("report")
SAMPLES = _name("samples")
EVAL_PROMPTS = _name("eval_prompts")
TOKENS = _name("tokens")
TRACKING_CONFIG = _name("tracking_config")
TRAINER_STATE = _name("trainer_state")
REDONE = _name("redone")
DELIVERY_STATE = _name("delivery_state")
DELIVERY_LOCK = _name("delivery_lock")
DELIVERY_LOG = _name("delivery_log")
LOGS = _name("logs")
PROFILER = _name("profiler")
PROFILER_SUMMARIES = _name("profiler_summaries")
PROFILER_REQUESTED = _name("profiler_requested")
PROFILER_PROCESSES = _name("profiler_processes")
PY_SPY = _name("py_spy")
RAY_TIMELINE = _name("ray_timeline")
SERVICES = _name("services")
DIAGNOSE = _name("diagnose")
CHECKPOINTS = _name("checkpoints")
WEIGHTS = _name("weights")
FAULTS = _name("faults")
COLLECTIVES = _name("collectives")
LOCK = _name("lock")
MLFLOW_DB = _name("mlflow_db")
MLARTIFACTS = _name("mlartifacts")
TENSORBOARD = _name("tensorboard")
WANDB = _name("wandb")


class RunLayout:
    """The paths of one run dir: `RunLayout(run_dir).journal` is RUN_DIR/metrics.jsonl, and so on for every
    key of `ENTRIES`."""

    def __init__(self, run_dir: str | Path):
        self.root = Path(run_dir)

    def __getattr__(self, key: str) -> Path:
        entry = ENTRIES.get(key)
        if entry is None:
            raise AttributeError(f"RUN_DIR has no entry {key!r}; see miles.record.layout.ENTRIES")
        return self.root / entry.path.rstrip("/")

    def log(self, name: str) -> Path:
        """RUN_DIR/logs/<name> (engine-<i>.log, router.log, mlflow-ui.log)."""
        return self.root / LOGS / name


# The profiler folder's bookkeeping (pids for py-spy, windows asked for, the services `miles diagnose` finds)
# is written by every run; only what is left besides them is a profile. Every file ENTRIES puts directly in
# profiler/ that is not a profile belongs here.
PROFILER_BOOKKEEPING = frozenset({Path(PROFILER_PROCESSES).name, Path(PROFILER_REQUESTED).name,
                                  Path(SERVICES).name})


def has_traces(directory: str | Path) -> bool:
    """Whether a profiler folder holds any profile (a trace, summary, snapshot, dump or Ray timeline), not
    only the bookkeeping every run writes there."""
    root = Path(directory)
    if not root.is_dir():
        return False
    return any(p.is_file() and not (p.parent == root and p.name in PROFILER_BOOKKEEPING) for p in root.rglob("*"))
