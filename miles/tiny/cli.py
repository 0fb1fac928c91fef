"""`miles base-model`: make the tiny warm-started checkpoint if missing and print its directory."""
from __future__ import annotations

import argparse
import json

from miles.tiny.warmstart import base_model_dir, ensure_base_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="miles base-model", description=__doc__)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    existed = (base_model_dir() / "warmstart.json").exists()
    path = ensure_base_model(progress=not args.quiet)
    report = json.loads((path / "warmstart.json").read_text())
    state = "cached" if existed else f"made in {report['seconds']}s"
    print(f"base model ({state}): {report['steps']} SFT steps, held-out greedy accuracy "
          f"{report['eval_greedy_accuracy']:.3f}, sampled pass@1 {report['eval_pass_at_1']:.3f}")
    print(path)
    return 0
