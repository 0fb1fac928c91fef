"""`miles base-model`: make the tiny warm-started checkpoint if missing and print its directory."""
from __future__ import annotations

import argparse
import json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="miles base-model", description=__doc__)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--multi-turn", action="store_true",
                        help="the multi-turn calculator task's checkpoint instead of the addition one")
    parser.add_argument("--moe", action="store_true",
                        help="the tiny mixture-of-experts policy's checkpoint (4 experts, top-2; "
                             "--tiny-policy moe) instead of the dense one")
    args = parser.parse_args(argv)
    if args.multi_turn and args.moe:
        parser.error("--moe: the tiny mixture-of-experts policy is made for the addition task "
                     "only, not with --multi-turn")
    if args.multi_turn:
        from miles.tiny.tool_warmstart import ensure_tool_model as ensure, tool_model_dir as target
    elif args.moe:
        from miles.tiny.warmstart import ensure_moe_base_model as ensure
        from miles.tiny.warmstart import moe_base_model_dir as target
    else:
        from miles.tiny.warmstart import base_model_dir as target, ensure_base_model as ensure
    from miles.tiny.defaults import MAKING_TAKES

    existed = (target() / "warmstart.json").exists()
    if not existed:  # the warm start takes minutes: say so before it starts, not after the first check
        kind = "multi-turn " if args.multi_turn else "mixture-of-experts " if args.moe else ""
        print(f"making the {kind}tiny base model (first start on this machine "
              f"only, {MAKING_TAKES}; a supervised warm start until held-out accuracy reaches its target): "
              f"{target()}", flush=True)
    path = ensure(progress=not args.quiet)
    report = json.loads((path / "warmstart.json").read_text())
    state = "cached" if existed else f"made in {report['seconds']}s"
    if args.multi_turn:
        print(f"multi-turn base model ({state}): {report['steps']} SFT steps, first-token tool-call probability "
              f"{report['tool_call_probability']:.3f}, held-out greedy tool path {report['tool_path_greedy_accuracy']:.3f}")
    else:
        print(f"{'MoE ' if args.moe else ''}base model ({state}): {report['steps']} SFT steps, "
              f"held-out greedy accuracy "
              f"{report['eval_greedy_accuracy']:.3f}, sampled pass@1 {report['eval_pass_at_1']:.3f}")
    print(path)
    return 0
