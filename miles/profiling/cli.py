"""`miles py-spy RUN_DIR`: one py-spy dump of every live process of a running training run."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from miles.profiling.pyspy import PySpyUnavailable, dump_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="miles py-spy", description=__doc__.split(": ", 1)[1])
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (--run-dir) of a live run")
    args = parser.parse_args(argv)
    try:
        written = dump_all(Path(args.run_dir))
    except (FileNotFoundError, PySpyUnavailable) as exc:
        print(f"miles py-spy: error: {exc}", file=sys.stderr)
        return 1
    if not written:
        print(f"miles py-spy: no live process of {args.run_dir} to dump", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0
