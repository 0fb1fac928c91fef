"""Megatron's parallel layouts side by side in one run: per layout, the training step, the log-prob
pass, what each rank holds, and the weight push to a live engine by each transfer mode, beside a
plain in-process copy of the same bytes.

    .venv/bin/python benchmarks/parallel_layouts.py [--steps 5] [--push-rounds 3]
        [--buckets-mib 0.25,512] [--layouts 1,dp2,...] [--threads-per-rank 1]
        [--hidden-size 128] [-- RUN FLAGS for every layout]

Layouts (real Megatron rank groups, Ray actors on gloo, the tiny policy; EP on the tiny MoE one):
1 rank, DP=2, TP=2, TP=2 with sequence parallel, PP=2, TP=2 x PP=2 (4 ranks: on a 2-core machine
they are oversubscribed, which the table marks), and the MoE at 1 rank and at EP=2. Each model's
1-rank group is started first and held; every other layout is started in turn, trains in turns
with it and is stopped (so no more than 4 + 2 ranks hold memory at once). Every layout trains the
same rollout-shaped batch of the default config's shape (256 samples, micro-batches of 64, one
optimizer step per call) from the same seed: one warm-up call, then `--steps` rounds in which the
layout and its 1-rank group train once each, the order reversed every other round, so a noisy
neighbour slows both alike and a layout's step ratio is taken from its own rounds. Each rank
runs `--threads-per-rank` torch threads (1: a core each, as a GPU each). Step seconds are the
slowest rank's forward+backward+optimizer (`actor_train_time`), the log-prob pass the slowest
rank's no-grad pass; each rank's parameter, gradient and optimizer bytes and peak memory are
what it reports (`miles.backends.rank_memory`: on CPU the peak is the process's peak RSS,
interpreter and libraries included).

Then each layout's weights go through `WeightSync` (as a run pushes them) to an
embedded engine on loopback serving the same model: the disk path (every rank exports, rank 0
writes the HF checkpoint, the engine loads it) and broadcast (`--update-weight-transfer-mode
broadcast`) at each `--buckets-mib` size (512 MiB is Miles' default), one untimed push each (the
broadcast group is built once and kept, as in a run), then `--push-rounds` timed rounds of all
modes, each push checked digest-equal on the engine. A push's seconds are the whole
`WeightSync.push` (gather, send, the engine's swap); GB/s is the HF state's bytes over them, the
same bytes a plain in-process copy into touched buffers moves (the floor). The tiny policy's
1.6 MB is round trips, not bandwidth: `--hidden-size 1024` pushes a freshly initialised model of
its shape 8x as wide (about 100 MB; pass a smaller batch after `--`). Prints a table, then one
JSON line: the figures and, per layout, its ratios to its model's 1-rank layout and the push's
GB/s over the copy's.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.train import synthetic_rollout  # noqa: E402  (the same rollout-shaped batch)
from benchmarks.weight_sync import copy_seconds  # noqa: E402  (the same in-process copy)

DEFAULT_BUCKET_MIB = 512.0  # Miles' --update-weight-buffer-size
TINY_HIDDEN = 128
COPIES_PER_ROUND = 5
MEMORY = ("param_bytes", "grad_bytes", "optimizer_bytes", "peak_memory_bytes")


@dataclass(frozen=True)
class Layout:
    key: str  # --layouts' name and the JSON's
    label: str
    world: int
    tp: int = 1
    pp: int = 1
    ep: int = 1
    sp: bool = False
    moe: bool = False

    def flags(self) -> list[str]:
        return ["--train-backend", "megatron", "--actor-num-gpus-per-node", str(self.world),
                "--tensor-model-parallel-size", str(self.tp),
                "--pipeline-model-parallel-size", str(self.pp),
                "--expert-model-parallel-size", str(self.ep),
                "--sequence-parallel", str(self.sp).lower()]

    @property
    def baseline(self) -> str:
        """The 1-rank layout of the same model: what this one's ratios are taken against."""
        return "moe1" if self.moe else "1"


LAYOUTS = [Layout("1", "1 rank", 1), Layout("dp2", "DP=2", 2), Layout("tp2", "TP=2", 2, tp=2),
           Layout("tp2sp", "TP=2+SP", 2, tp=2, sp=True), Layout("pp2", "PP=2", 2, pp=2),
           Layout("tp2pp2", "TP=2 x PP=2", 4, tp=2, pp=2),
           Layout("moe1", "MoE 1 rank", 1, moe=True), Layout("ep2", "MoE EP=2", 2, ep=2, moe=True)]
BY_KEY = {layout.key: layout for layout in LAYOUTS}


def mode_key(mode: str, bucket: int | None) -> str:
    return "disk" if bucket is None else f"broadcast_{bucket_label(bucket)}"


def bucket_label(nbytes: int) -> str:
    mib = nbytes / 2**20
    return f"{mib:g}MiB" if mib >= 1 else f"{nbytes // 1024}KiB"


def layout_config(layout: Layout, mode: str = "disk", bucket: int | None = None,
                  extra: tuple[str, ...] = ()):
    from miles.config import parse_config

    argv = layout.flags() + list(extra) + ["--update-weight-transfer-mode", mode]
    if bucket is not None:
        argv += ["--update-weight-buffer-size", str(bucket)]
    return parse_config(argv)


def summarize_memory(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """The most any rank holds of each kind (the figure that decides whether a layout fits) and
    the sum over ranks of the parameters (replicas and shards together)."""
    out = {f"max_rank_{kind}": max(m.get(kind, 0.0) for m in per_rank) for kind in MEMORY}
    out["all_ranks_param_bytes"] = sum(m.get("param_bytes", 0.0) for m in per_rank)
    return out


def layout_ratios(row: dict, base: dict) -> dict[str, float]:
    """A layout's figures over its model's 1-rank layout's: memory, the most one rank holds;
    seconds, over the 1-rank group's in the rounds they trained in turns (`paired_1rank`)."""
    out = {f"{kind}_vs_1rank": row["memory"][f"max_rank_{kind}"] /
           base["memory"][f"max_rank_{kind}"] for kind in MEMORY
           if base["memory"][f"max_rank_{kind}"] > 0}
    paired = row.get("paired_1rank", base)  # the 1-rank figures of the same rounds
    out["step_vs_1rank"] = row["step_s"] / paired["step_s"]
    out["log_probs_vs_1rank"] = row["log_probs_s"] / paired["log_probs_s"]
    return out


def push_ratios(pushes: dict[str, dict], copy_gbps: float) -> dict[str, float]:
    """Each transfer mode's GB/s over the in-process copy's, and broadcast's over disk's."""
    out = {f"{key}_over_copy": p["gb_per_s"] / copy_gbps for key, p in pushes.items()}
    disk = pushes.get("disk", {}).get("gb_per_s")
    if disk:
        out.update({f"{key}_over_disk": p["gb_per_s"] / disk for key, p in pushes.items()
                    if key != "disk"})
    return out


def rank_batches(config):
    """The same batch for every layout (seed 0), split as the trainer splits it for this one."""
    from miles.backends.pack import split_for_ranks

    samples, advantages = synthetic_rollout(config, seed=0)
    return split_for_ranks(samples, advantages, config.global_batch_size, config.world_size,
                           rollout_id=0)


def train_rounds(groups: dict, steps: int) -> dict[str, dict]:
    """One warm-up call per layout, then `steps` rounds in which every layout trains once (the
    order reversed every other round, so the shared machine's slow spells hit all alike): the
    median seconds (slowest rank) and each rank's memory after its last call."""
    batches = {key: rank_batches(config) for key, (_, config) in groups.items()}
    times = {key: {"step": [], "log_probs": [], "wall": []} for key in groups}
    results = {}
    order = list(groups)
    for call in range(steps + 1):
        for key in (order if call % 2 == 0 else order[::-1]):
            start = time.perf_counter()
            results[key] = groups[key][0].train(batches[key])
            if call:  # call 0 warms up
                times[key]["wall"].append(time.perf_counter() - start)
                times[key]["step"].append(max(r.actor_train_time for r in results[key]))
                times[key]["log_probs"].append(max(r.log_probs_time for r in results[key]))
    rows = {}
    for key, t in times.items():
        per_rank = [r.memory for r in results[key]]
        rows[key] = {"step_s": statistics.median(t["step"]), "step_s_min": min(t["step"]),
                     "log_probs_s": statistics.median(t["log_probs"]),
                     "train_call_s": statistics.median(t["wall"]), "step_s_all": t["step"],
                     "rank_memory": per_rank, "memory": summarize_memory(per_rank)}
    return rows


def timed_push(group, layout: Layout, mode: str, bucket: int | None, engine_url: str,
               export_root: Path, version: int, digest: str, extra=()) -> tuple[float, dict]:
    """One push through WeightSync with this mode's flags, checked digest-equal on the engine."""
    import httpx

    from miles.backends.sync import WeightSync

    view = copy.copy(group)  # the same ranks, this mode's flags (WeightSync reads them)
    view.config = layout_config(layout, mode, bucket, tuple(extra))
    sync = WeightSync(view, [engine_url], None, export_root, in_memory=False)
    start = time.perf_counter()
    sync.push(version)
    seconds = time.perf_counter() - start
    served = httpx.get(engine_url + "/weights_digest", timeout=600).json()
    if served != {"digest": digest, "weight_version": str(version)}:
        raise SystemExit(f"{layout.label}: the engine's weights after the "
                         f"{mode_key(mode, bucket)} push differ from the ranks'")
    return seconds, dict(sync.last_times)


def one_thread_copies(named: list) -> list[float]:
    """COPIES_PER_ROUND plain copies on one torch thread, as each rank runs (several threads
    meeting at a barrier per tensor make a 1.6 MB copy wait on a loaded machine's scheduler)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return [copy_seconds(named) for _ in range(COPIES_PER_ROUND)]
    finally:
        torch.set_num_threads(threads)


def push_figures(group, layout: Layout, engine_url: str, args,
                 version: int) -> tuple[dict, int, int]:
    """One untimed push per mode (a broadcast group is built once and kept, as in a run), then
    `--push-rounds` timed ones per mode, interleaved; per mode its median seconds and GB/s over
    the HF state's bytes, and the plain copy of the same bytes beside them."""
    named = list(group.call("export_weights", None)[0].items())
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    digest = group.call("weights_digest")[0]
    modes = [("disk", None)] + [("broadcast", b) for b in args.buckets]
    seconds: dict[str, list[float]] = {mode_key(m, b): [] for m, b in modes}
    seconds["copy"] = []
    metrics: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="miles-bench-layouts-") as tmp:
        for round_ in range(args.push_rounds + 1):
            if round_:  # the copy is short: several per round, so one preemption is no median
                seconds["copy"] += one_thread_copies(named)
            for mode, bucket in modes:
                version += 1
                took, last = timed_push(group, layout, mode, bucket, engine_url, Path(tmp),
                                        version, digest, args.flags)
                key = mode_key(mode, bucket)
                if round_:
                    seconds[key].append(took)
                    metrics[key] = last
                else:  # the untimed first push of each mode: the first broadcast joins
                    connect = last.get("perf/update_weights_connect_time", 0.0)
                    metrics["connect_s"] = max(connect, metrics.get("connect_s", 0.0))
    figures = {key: {"seconds": statistics.median(s),
                     "gb_per_s": nbytes / statistics.median(s) / 1e9} for key, s in seconds.items()}
    for key in figures:
        last = metrics.get(key, {})
        if "perf/update_weights_buckets" in last:
            figures[key]["buckets"] = int(last["perf/update_weights_buckets"])
        # a pipeline's stages each send over their own group: each one's seconds and bytes
        stages = {k: v for k, v in last.items() if k.startswith("perf/update_weights_pp_")}
        if stages:
            figures[key]["stages"] = stages
    figures["copy"]["connect_s"] = metrics.get("connect_s", 0.0)
    return figures, nbytes, version


def set_threads(group, threads: int) -> None:
    """Each rank's torch threads (0: leave the group's own choice, the cores over its ranks)."""
    import ray

    def set_num_threads(rank, n):
        import torch

        torch.set_num_threads(n)

    if threads > 0:
        ray.get([a.__ray_call__.remote(set_num_threads, threads) for a in group.actors])


def start_group(layout: Layout, models: dict, args):
    """A layout's ranks, their threads set: (group, its config, seconds to start)."""
    from miles.backends.group import ActorGroup

    config = layout_config(layout, extra=tuple(args.flags))
    start = time.perf_counter()
    group = ActorGroup(config, models[layout.moe])
    took = time.perf_counter() - start
    try:
        set_threads(group, args.threads_per_rank)
    except BaseException:
        group.stop()
        raise
    print(f"  {layout.label}: ranks up in {took:.0f} s", file=sys.stderr)
    return group, config, took


def measure_layout(layout: Layout, held, base, engine_url: str, args, version: int
                   ) -> tuple[dict, int]:
    """A layout's row: trained in turns with its model's 1-rank group `base` (None: it is that
    group), then its pushes. `held` is its (group, config, start seconds)."""
    group, config, started = held
    pair = {layout.key: (group, config)}
    if base is not None:
        pair[layout.baseline] = base[:2]
    timed = train_rounds(pair, args.steps)
    row = timed[layout.key]
    if base is not None:  # the 1-rank step of the same rounds: the ratio's other side
        row["paired_1rank"] = {k: timed[layout.baseline][k] for k in ("step_s", "log_probs_s")}
    row.update(describe(layout, group, started))
    pushes, nbytes, version = push_figures(group, layout, engine_url, args, version)
    copy_ = pushes.pop("copy")
    row.update(pushes=pushes, bytes=nbytes, copy_gb_per_s=copy_["gb_per_s"],
               connect_s=copy_["connect_s"], push_ratios=push_ratios(pushes, copy_["gb_per_s"]))
    print(f"  {layout.label}: {json.dumps(row)}", file=sys.stderr)  # kept if a later one fails
    return row, version


def print_table(rows: dict[str, dict], buckets: list[int]) -> None:
    mb = 1e6
    print(f"{'layout':<14}{'ranks':>6}{'step s':>8}{'1rank s':>8}{'x1rank':>7}{'logp s':>8}"
          f"{'param MB':>9}{'grad MB':>8}{'optim MB':>9}{'x1rank':>7}{'peak MB':>8}")
    for row in rows.values():
        m, r = row["memory"], row["ratios"]
        paired = row.get("paired_1rank", row)
        ranks = f"{row['ranks']}{'*' if row['oversubscribed'] else ''}"
        print(f"{row['label']:<14}{ranks:>6}{row['step_s']:>8.3f}{paired['step_s']:>8.3f}"
              f"{r.get('step_vs_1rank', 0):>7.2f}{row['log_probs_s']:>8.3f}"
              f"{m['max_rank_param_bytes'] / mb:>9.3f}{m['max_rank_grad_bytes'] / mb:>8.3f}"
              f"{m['max_rank_optimizer_bytes'] / mb:>9.3f}"
              f"{r.get('param_bytes_vs_1rank', 0):>7.2f}"
              f"{m['max_rank_peak_memory_bytes'] / mb:>8.0f}")
    print_pushes(rows, buckets)
    print("\n* more ranks than cores: oversubscribed. 1rank s: the 1-rank group's step in the "
          "same rounds (x1rank: the ratio). Memory: the most one rank holds (x1rank: over its "
          "model's 1-rank layout); peak = the process's peak RSS on CPU.")


def print_pushes(rows: dict[str, dict], buckets: list[int]) -> None:
    keys = ["disk"] + [mode_key("broadcast", b) for b in buckets]
    print(f"\n{'push s (GB/s)':<14}{'MB':>6}" + "".join(f"{k:>26}" for k in keys)
          + f"{'copy GB/s':>10}")
    for row in rows.values():
        cells = "".join(f"{row['pushes'][k]['seconds']:>15.3f} ({row['pushes'][k]['gb_per_s']:.4f})"
                        for k in keys)
        print(f"{row['label']:<14}{row['bytes'] / 1e6:>6.2f}{cells}{row['copy_gb_per_s']:>10.2f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="timed training calls per layout")
    parser.add_argument("--push-rounds", type=int, default=3, help="pushes per mode and layout")
    parser.add_argument("--buckets-mib", default=f"0.25,{DEFAULT_BUCKET_MIB:g}")
    parser.add_argument("--threads-per-rank", type=int, default=1,
                        help="torch threads per rank (one core each, as one GPU each); 0: the "
                             "trainer's own choice (the cores over the ranks: 2 for one rank here)")
    parser.add_argument("--hidden-size", type=int, default=TINY_HIDDEN,
                        help="the dense layouts' model width (128: the tiny policy; wider: a "
                             "freshly initialised model of its shape, for the pushes' GB/s)")
    parser.add_argument("flags", nargs="*", help="after --: run flags for every layout "
                        "(e.g. -- --rollout-batch-size 4 --micro-batch-size 8)")
    parser.add_argument("--layouts", default=",".join(layout.key for layout in LAYOUTS))
    args = parser.parse_args(argv)
    args.buckets = [int(float(b) * 2**20) for b in args.buckets_mib.split(",")]
    chosen = [layout for layout in LAYOUTS if layout.key in args.layouts.split(",")]
    rows = measure(chosen, args)
    for key, row in rows.items():
        base = rows.get(BY_KEY[key].baseline)
        row["ratios"] = layout_ratios(row, base) if base else {}
    print_table(rows, args.buckets)
    print(json.dumps({"cpus": os.cpu_count(), "load_avg_1m_at_end": os.getloadavg()[0],
                      "steps": args.steps, "push_rounds": args.push_rounds,
                      "threads_per_rank": args.threads_per_rank,
                      "hidden_size": args.hidden_size, "flags": args.flags,
                      "buckets": args.buckets, "layouts": rows}))
    return 0


def measure(chosen: list[Layout], args) -> dict[str, dict]:
    """Each model's 1-rank group is started first and held; every other layout in turn is
    started, trained in turns with it, pushes, and is stopped (so at most one layout's ranks
    besides the 1-rank groups hold memory). The layouts push one at a time: they share the
    engine's update group name."""
    import ray

    models = model_dirs(chosen, args.hidden_size)
    engines = start_engines(models)
    try:
        start_ray()
    except BaseException:
        for engine in engines.values():
            engine.stop()
        raise
    bases: dict = {}
    rows, version = {}, 0
    try:
        for moe in models:
            layout = BY_KEY["moe1" if moe else "1"]
            bases[layout.key] = start_group(layout, models, args)
            rows[layout.key], version = measure_layout(layout, bases[layout.key], None,
                                                       engines[moe].url, args, version)
        for layout in (la for la in chosen if la.key not in bases):
            held = start_group(layout, models, args)
            try:
                rows[layout.key], version = measure_layout(
                    layout, held, bases[layout.baseline], engines[layout.moe].url, args, version)
            finally:
                held[0].stop()
    finally:
        for group, _, _ in bases.values():
            group.stop()
        ray.shutdown()
        for engine in engines.values():
            engine.stop()
    return {la.key: rows[la.key] for la in LAYOUTS if la.key in rows}


def start_ray(tries: int = 5) -> None:
    """A local Ray as a run starts it (its workers wait passively). Ray gives its raylet a fixed
    30 s to register, which a machine with dozens of runnable processes can miss: tried again."""
    import ray

    from miles.cluster.connect import connect

    # Ray's memory monitor kills this Ray's newest workers once the node is 95% full, whoever
    # filled it: on a machine shared with other jobs that ended runs here mid-push
    os.environ.setdefault("RAY_memory_usage_threshold", "0.98")
    for attempt in range(1, tries + 1):
        try:
            connect(None, log_to_driver=False)
            return
        except Exception as exc:
            if "timed out during startup" not in str(exc) or attempt == tries:
                raise
            ray.shutdown()
            print(f"  Ray did not start in time ({attempt}/{tries}); again", file=sys.stderr)


def model_dirs(chosen: list[Layout], hidden: int) -> dict[bool, str]:
    """{moe: checkpoint} of the models the chosen layouts train."""
    from miles.tiny.warmstart import ensure_base_model, ensure_moe_base_model

    dense = ensure_base_model(progress=False)
    if hidden != TINY_HIDDEN:
        dense = wide_checkpoint(hidden, Path(tempfile.mkdtemp(prefix="miles-wide-")))
    models = {False: str(dense)} if any(not la.moe for la in chosen) else {}
    if any(layout.moe for layout in chosen):
        models[True] = str(ensure_moe_base_model(progress=False))
    return models


def wide_checkpoint(hidden: int, out: Path) -> Path:
    """The tiny policy's shape (2 layers, 4 heads, 2 KV heads, its vocabulary) at `hidden` wide,
    freshly initialised: enough bytes for a push's GB/s to be about bandwidth, not round trips."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from miles.tiny.model import seeded_model, tiny_shape, tiny_shape_fields
    from miles.tiny.warmstart import save_checkpoint

    if hidden % 4:
        raise SystemExit(f"--hidden-size {hidden}: must divide by the 4 attention heads")
    tokenizer, tiny = tiny_shape()
    fields = tiny_shape_fields(tiny.vocab_size, tiny.pad_token_id, tiny.eos_token_id)
    fields.update(hidden_size=hidden, intermediate_size=3 * hidden, head_dim=hidden // 4)
    save_checkpoint(seeded_model(Qwen3ForCausalLM, Qwen3Config(**fields), 0), tokenizer, out)
    return out


def start_engines(models: dict) -> dict:
    from miles.config import EngineConfig
    from miles.engines.launch import launch_engine

    logs = Path(tempfile.mkdtemp(prefix="miles-bench-layouts-"))
    return {moe: launch_engine(path, EngineConfig(engine_device="cpu", engine_max_batch_size=4),
                               log_path=logs / f"engine-{'moe' if moe else 'dense'}.log")
            for moe, path in models.items()}


def describe(layout: Layout, group, started: float) -> dict:
    return {"label": layout.label, "ranks": layout.world, "start_s": started,
            "megatron_layout": group.call("info")[0].extra["parallel"]["layout"],
            "oversubscribed": layout.world > (os.cpu_count() or 1)}


if __name__ == "__main__":
    sys.exit(main())
