"""`miles pretrained NAME`: make a catalog checkpoint (a standard HF directory) if missing; print its dir."""
from __future__ import annotations

import argparse
import json
import sys

from miles.config.checkpoints import CATALOG, checkpoint_dir, is_made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="miles pretrained", description=__doc__)
    parser.add_argument("name", nargs="?", choices=sorted(CATALOG), metavar="NAME",
                        help=f"one of: {', '.join(sorted(CATALOG))}")
    parser.add_argument("--list", action="store_true", help="list the catalog and what is made")
    args = parser.parse_args(argv)
    if args.list or args.name is None:
        for entry in CATALOG.values():
            state = "made" if is_made(entry) else "not made"
            print(f"{entry.name}  ({state}, {entry.license})  {entry.about}\n  {checkpoint_dir(entry)}")
        return 0
    from miles.pretrained.make import MakeError, make_checkpoint

    entry = CATALOG[args.name]
    existed = is_made(entry)
    try:
        path = make_checkpoint(entry)
    except MakeError as exc:
        print(f"miles pretrained: error: {exc}", file=sys.stderr)
        return 1
    facts = json.loads((path / "made.json").read_text())
    state = "cached" if existed else f"made in {facts['seconds']}s"
    print(f"{entry.name} ({state}): {facts['architecture']}, {facts['parameters'] / 1e6:.1f}M parameters, "
          f"vocabulary {facts['vocab_size']}, eos ids {facts['eos_token_ids']}")
    print(path)
    return 0
