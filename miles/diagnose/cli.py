"""`miles diagnose RUN_DIR`: why a live or dead run is stuck, slow or dead: prints the verdict and the
path of one .tar.gz bundle (stacks, Ray state, logs, config, delivery, health, timeline)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from miles.config import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="miles diagnose", description=__doc__.split(": ", 1)[1])
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (--run-dir) of a live or dead run")
    parser.add_argument("--out", metavar="PATH", default=None,
                        help="the bundle's file path, in a folder that exists (default "
                             "RUN_DIR/diagnose/diagnose-<time>.tar.gz)")
    parser.add_argument("--json", action="store_true", help="print the verdict and bundle path as one JSON object")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise ConfigError("RUN_DIR", f"{run_dir} is not a directory")
    from miles.diagnose.bundle import collect

    try:
        diagnosis = collect(run_dir, out=Path(args.out) if args.out else None)
    except OSError as exc:  # the bundle's folder not writable, a full disk
        flag = "--out" if args.out else "RUN_DIR"
        print(f"miles diagnose: error: {flag}: cannot write the bundle ({exc.strerror or exc}: "
              f"{exc.filename or ''})", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"bundle": str(diagnosis.path), "verdict": diagnosis.verdict}, default=str))
    else:
        print(diagnosis.text, end="")
        print(f"bundle: {diagnosis.path}")
    return 0


if __name__ == "__main__":
    from miles.config import run_main

    run_main(main, "miles diagnose")
