"""The `miles` command: one subcommand per entry point, each imported only when used.

Imports are lazy so `miles engine` or `miles router` start without loading Prefect,
Ray or the trainer.
"""
from __future__ import annotations

import importlib
import sys

from miles.config import ConfigError

SUBCOMMANDS = {
    "train": ("flows.train_command:main", "run the GRPO training flow (Prefect on Ray); no flags: the tiny CPU run"),
    "engine": ("miles.engines.cli:main", "serve a checkpoint over SGLang's HTTP API (embedded engine or SGLang)"),
    "router": ("miles.router.cli:main", "run the router in front of the engines"),
    "base-model": ("miles.tiny.cli:main", "make the tiny warm-started base checkpoint if missing; print its dir"),
    "pretrained": ("miles.pretrained.cli:main", "make a named real checkpoint (smollm2-135m-instruct) if missing; print its dir"),
    "doctor": ("miles.health.cli:main", "a run's health verdicts (RUN_DIR); --env: the installation and services"),
    "replay-spool": ("miles.tracking.cli:main", "deliver tracker points spooled during an outage (--follow: a run's live delivery)"),
    "py-spy": ("miles.profiling.cli:main", "one py-spy dump of every process of a live run (RUN_DIR)"),
    "diagnose": ("miles.diagnose.cli:main", "why a live or dead run is stuck, slow or dead: a verdict and one bundle (RUN_DIR)"),
    "dashboard": ("miles.dashboard.cli:main", "serve a run directory's web view (metrics, timeline, samples, tokens)"),
    "compare": ("miles.compare.cli:main", "a run against baseline runs: verdict per signal, prompt diff (exit 1 on a regression)"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: miles <command> [flags]   (miles <command> --help for its flags)", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"miles: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module, func = SUBCOMMANDS[name][0].split(":")
    entry = getattr(importlib.import_module(module), func)
    try:
        return entry(rest) or 0
    except ConfigError as exc:
        print(f"miles {name}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
