"""Weight sync to a live engine, side by side: broadcast in buckets (--update-weight-transfer-mode
broadcast) at several bucket sizes, the disk path (write an HF checkpoint,
/update_weights_from_disk), and a plain in-process copy of the same bytes (the floor any transfer
is measured against).

    .venv/bin/python benchmarks/weight_sync.py [--model smollm2-135m-instruct|tiny] [--rounds 3]
                                               [--buckets-mib 16,64,512]

The sender is this process (as rank 0 is in a run): it holds the model's HF state in float32 and
pushes it, perturbed each round, to an embedded engine on loopback serving the same model on the
CPU. Each case runs `--rounds` times, interleaved, and is reported by its median seconds and GB/s
(bytes sent over seconds, the engine's swap included); every broadcast push is checked digest-equal
on the engine. Prints a table, then one JSON line: the figures and, per bucket size, broadcast GB/s
over the copy's and over disk.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from miles.backends import hf_weights as W  # noqa: E402
from miles.backends.weight_broadcast import WeightBroadcaster  # noqa: E402
from miles.config import EngineConfig  # noqa: E402
from miles.engines.launch import launch_engine  # noqa: E402
from miles.engines.weights import push_weights_from_disk  # noqa: E402
from miles.serving.weight_group import state_digest  # noqa: E402


def model_dir(name: str) -> Path:
    if name == "tiny":
        from miles.tiny.warmstart import ensure_base_model

        return Path(ensure_base_model(progress=False))
    from miles.config.checkpoints import CATALOG
    from miles.pretrained.make import make_checkpoint

    return Path(make_checkpoint(CATALOG[name]))


def sent_state(state: dict, tied: bool, round_: int) -> tuple[list, dict]:
    """What a rank sends (no tied head) and the engine's whole state after it, per round."""
    new = {k: v + 1e-3 * (round_ + 1) for k, v in state.items()}
    if tied:
        new[W.TIED_HEAD] = new[W.TIED_EMBED]
    return [(k, v) for k, v in new.items() if not (tied and k == W.TIED_HEAD)], new


def copy_seconds(named: list) -> float:
    """A plain in-process copy of the same bytes into buffers allocated (and touched) beforehand."""
    targets = [torch.zeros_like(t) for _, t in named]
    start = time.perf_counter()
    for target, (_, tensor) in zip(targets, named):
        target.copy_(tensor)
    return time.perf_counter() - start


def disk_seconds(url: str, named: list, base: Path, tied: bool, version: str) -> float:
    """The whole-checkpoint path: rank 0 writes an HF checkpoint, the engine loads it."""
    with tempfile.TemporaryDirectory(prefix="miles-bench-weights-") as tmp:
        start = time.perf_counter()
        W.write_hf_checkpoint(dict(named), Path(tmp) / "v", base, tied)
        push_weights_from_disk(url, Path(tmp) / "v", version)
        return time.perf_counter() - start


def broadcast_seconds(sender: WeightBroadcaster, url: str, named: list, whole: dict, bucket: int,
                      version: str) -> tuple[float, int]:
    start = time.perf_counter()
    stats = sender.push(named, bucket, version)
    seconds = time.perf_counter() - start
    served = httpx.get(url + "/weights_digest", timeout=600).json()
    if served != {"digest": state_digest(whole), "weight_version": version}:
        raise SystemExit(f"the engine's weights after the {bucket}-byte push differ from what "
                         "was sent")
    return seconds, len(stats.bucket_bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--buckets-mib", default="16,64,512")
    args = parser.parse_args()
    base = model_dir(args.model)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    tied = bool(model.config.tie_word_embeddings)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    del model
    buckets = [int(float(b) * 2**20) for b in args.buckets_mib.split(",")]
    engine = launch_engine(base, EngineConfig(engine_device="cpu", engine_max_batch_size=4),
                           log_path=Path(tempfile.mkdtemp(prefix="miles-bench-")) / "engine.log")
    sender = WeightBroadcaster([engine.url], group_name="bench", timeout_s=600)
    seconds: dict[str, list[float]] = {"copy": [], "disk": []}
    seconds.update({f"broadcast_{b}": [] for b in buckets})
    counts: dict[int, int] = {}
    try:
        sender.connect()  # once, as a run keeps its group: not in any push's time
        for r in range(args.rounds):
            named, whole = sent_state(state, tied, r)
            seconds["copy"].append(copy_seconds(named))
            seconds["disk"].append(disk_seconds(engine.url, named, base, tied, f"disk-{r}"))
            for b in buckets:
                s, counts[b] = broadcast_seconds(sender, engine.url, named, whole, b, f"b{b}-{r}")
                seconds[f"broadcast_{b}"].append(s)
            print(f"  round {r + 1}/{args.rounds} done", file=sys.stderr)
        nbytes = sum(t.numel() * t.element_size() for _, t in named)
    finally:
        sender.close()
        engine.stop()
    report(args, nbytes, seconds, counts, buckets)


def report(args, nbytes: int, seconds: dict, counts: dict, buckets: list[int]) -> None:
    median = {k: statistics.median(v) for k, v in seconds.items()}
    gbps = {k: nbytes / s / 1e9 for k, s in median.items()}
    print(f"{args.model}: {nbytes / 1e6:.1f} MB of float32 weights, {args.rounds} rounds (median)")
    print(f"{'case':<22} {'buckets':>8} {'seconds':>9} {'GB/s':>8}")
    for key in seconds:
        n = counts.get(int(key.split("_")[1]), "") if key.startswith("broadcast_") else ""
        print(f"{key:<22} {n!s:>8} {median[key]:>9.3f} {gbps[key]:>8.3f}")
    ratios = {f"broadcast_{b}_over_copy": gbps[f"broadcast_{b}"] / gbps["copy"] for b in buckets}
    ratios.update({f"broadcast_{b}_over_disk": gbps[f"broadcast_{b}"] / gbps["disk"]
                   for b in buckets})
    print(json.dumps({"model": args.model, "bytes": nbytes, "rounds": args.rounds,
                      "seconds": median, "gb_per_s": gbps,
                      "buckets": {str(b): counts[b] for b in buckets}, **ratios}))


if __name__ == "__main__":
    main()
