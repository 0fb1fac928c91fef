"""`miles compare RUN_DIR BASELINE_DIR...`: a run against its baselines, signal by signal and step by step.

Exit 0 when every learning signal is within the baselines' corridor, 1 on a regression (a signal that
stays outside it, or a value missing or not finite), 2 on a usage error, 3 when a run dir cannot be read
or a baseline holds nothing to compare against. Timing signals (perf/*_time) are reported apart and
fail only with --gate-timing.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from miles.compare.curves import read_run, require_judged
from miles.record.journal import UnreadableRun
from miles.compare.comparison import EXIT_REGRESSION, EXIT_UNREADABLE, EXIT_WITHIN, compare, format_table
from miles.compare.mlflow_tags import tag_mlflow_run
from miles.compare.rules import DEFAULT_RULES, load_rules
from miles.compare.text import terminal_safe
from miles.config import ConfigError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="miles compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run to judge")
    parser.add_argument("baselines", metavar="BASELINE_DIR", nargs="+", help="run directories it is judged against")
    parser.add_argument("--json", action="store_true", help="print the comparison as one JSON object")
    parser.add_argument("--rules", type=Path, default=None, help='a JSON file {"rules": [...]} replacing the '
                        "default rules (see docs/user-guide/compare.md)")
    parser.add_argument("--finished", action="store_true", help="the run is finished: a step the baselines have "
                        "and the run does not is an error (default: steps past the run's last are not judged)")
    parser.add_argument("--mlflow-tracking-uri", default=None, help="tag the run's MLflow run in this store with "
                        "the baselines and verdicts (miles.compare, miles.compare.baselines, miles.compare.<metric>)")
    parser.add_argument("--mlflow-experiment-name", default="miles", help="its experiment (default miles)")
    parser.add_argument("--mlflow-run-id", default=None, help="the MLflow run to tag (default: the newest run "
                        "named after RUN_DIR in the experiment)")
    parser.add_argument("--gate-timing", action="store_true", help="a timing signal (perf/*_time) outside "
                        "its corridor fails the comparison too (default: reported as slower, exit 0: a busier "
                        "machine is not a broken run)")
    parser.add_argument("--top-prompts", type=int, default=10, help="eval prompts to list (default 10)")
    args = parser.parse_args(argv)
    if (args.mlflow_run_id or args.mlflow_experiment_name != "miles") and not args.mlflow_tracking_uri:
        raise ConfigError("--mlflow-run-id", "tags a run in an MLflow store: give --mlflow-tracking-uri too")
    if args.top_prompts < 0:
        raise ConfigError("--top-prompts", f"{args.top_prompts} is negative")
    return args


def check_distinct(baselines: list[str]) -> None:
    """Each baseline once: one given twice has no spread against itself, so the corridor lost the jitter
    widening a single baseline gets, and nothing said so (CN5)."""
    seen: dict[Path, str] = {}
    for given in baselines:
        first = seen.setdefault(Path(given).resolve(), given)
        if first is not given:
            raise ConfigError("BASELINE_DIR", terminal_safe(f"{given} is given twice (also as {first}); "
                                                            f"each baseline counts once"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rules = load_rules(args.rules, "--rules") if args.rules else DEFAULT_RULES
    if Path(args.run_dir).resolve() in {Path(b).resolve() for b in args.baselines}:
        raise ConfigError("BASELINE_DIR", f"{args.run_dir} is its own baseline")
    check_distinct(args.baselines)
    try:
        run = read_run(Path(args.run_dir), rules)
        baselines = [require_judged(read_run(Path(b), rules, "BASELINE_DIR")) for b in args.baselines]
    except UnreadableRun as exc:
        print(terminal_safe(f"miles compare: cannot read the run: {exc}"), file=sys.stderr)
        return EXIT_UNREADABLE
    result = compare(run, baselines, rules, finished=args.finished, top_prompts=args.top_prompts,
                     gate_timing=args.gate_timing)
    print(json.dumps(result.as_json(), allow_nan=False) if args.json else format_table(result))
    if args.mlflow_tracking_uri:
        try:
            run_id = tag_mlflow_run(args.mlflow_tracking_uri, result.tags(), run_id=args.mlflow_run_id,
                                    experiment=args.mlflow_experiment_name, run_name=run.name)
        except LookupError as exc:
            raise ConfigError("--mlflow-tracking-uri", str(exc)) from None
        print(f"MLflow run {run_id} tagged miles.compare={result.verdict}", file=sys.stderr)
    return EXIT_REGRESSION if result.failed else EXIT_WITHIN


if __name__ == "__main__":
    from miles.config import run_main

    run_main(main, "miles compare")
