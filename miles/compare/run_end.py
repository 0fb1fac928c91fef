"""A run given `--baseline-run-dirs` is compared with them when it ends: the table printed, the MLflow
run tagged (with `--use-mlflow`). Both drivers call it once the trackers are closed; it never fails the
run (a baseline that became unreadable, or MLflow away, is said and skipped)."""
from __future__ import annotations

import sys
from pathlib import Path

from miles.compare.comparison import Comparison, compare, format_table
from miles.compare.curves import read_run, require_judged
from miles.record.journal import UnreadableRun
from miles.compare.mlflow_tags import tag_mlflow_run
from miles.compare.rules import DEFAULT_RULES
from miles.config import ConfigError
from miles.config.run_info import run_name
from miles.record import layout

FLAG = "--baseline-run-dirs"


def check_baselines(dirs: list[str], run_dir: str | None) -> None:
    """Before anything starts: every baseline is a run dir, and none is the run itself."""
    for d in dirs:
        if not (Path(d) / layout.JOURNAL).is_file():
            raise ConfigError(FLAG, f"{d} is not a run directory (no {layout.JOURNAL})")
        if run_dir and Path(d).resolve() == Path(run_dir).resolve():
            raise ConfigError(FLAG, f"{d} is the run's own directory")


def compare_at_end(config) -> Comparison | None:
    t = config.tracking
    if not t.baseline_run_dirs:
        return None
    try:
        run = read_run(Path(config.train.run_dir))
        baselines = [require_judged(read_run(Path(d), flag=FLAG)) for d in t.baseline_run_dirs]
    except (ConfigError, UnreadableRun) as exc:
        print(f"[compare] not compared: {exc}", file=sys.stderr, flush=True)
        return None
    result = compare(run, baselines, DEFAULT_RULES, top_prompts=5)
    print(format_table(result), flush=True)
    if t.use_mlflow:
        try:
            run_id = tag_mlflow_run(t.mlflow_tracking_uri, result.tags(), run_id=t.mlflow_run_id,
                                    experiment=t.mlflow_experiment_name,
                                    run_name=t.mlflow_run_name or run_name(config.train.run_dir))
            print(f"[compare] MLflow run {run_id} tagged miles.compare={result.verdict}", flush=True)
        except Exception as exc:  # noqa: BLE001 - MLflow away or the run not there: said, never fatal
            print(f"[compare] MLflow run not tagged: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr,
                  flush=True)
    return result
