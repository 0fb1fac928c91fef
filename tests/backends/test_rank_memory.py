"""What a training rank holds (miles.backends.rank_memory): the bytes are the rank's own tensors,
so a Megatron TP=2 rank holds about half of what the single rank does; its phase spans and its
profiler traces name its dp/pp/tp coordinates."""
from __future__ import annotations

import gzip
import json
from types import SimpleNamespace

import torch

from miles.backends.group import ActorGroup
from miles.backends.pack import split_for_ranks
from miles.backends.rank_memory import KINDS, peak_rss_bytes, rank_memory, rank_memory_metrics
from miles.profiling.window import ProfileWindow
from tests.support.actors import LOSS, config, rollout_like


def test_the_bytes_are_the_ranks_own_tensors():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4, bias=False))
    optimizer = torch.optim.AdamW(model.parameters())
    before = rank_memory(model, optimizer, torch.device("cpu"))
    weights = sum(p.numel() for p in model.parameters()) * 4  # float32
    assert before["param_bytes"] == weights
    assert before["grad_bytes"] == before["optimizer_bytes"] == 0  # no step yet
    model(torch.randn(3, 8)).sum().backward()
    optimizer.step()
    after = rank_memory(model, optimizer, torch.device("cpu"))
    assert after["grad_bytes"] == weights
    # AdamW: two moments shaped like each parameter, and each parameter's step count
    steps = sum(s["step"].numel() * s["step"].element_size() for s in optimizer.state.values())
    assert after["optimizer_bytes"] == 2 * weights + steps
    assert after["peak_memory_bytes"] == peak_rss_bytes() > weights


def test_the_metrics_name_each_rank_and_the_most_any_holds():
    results = [SimpleNamespace(memory={"param_bytes": 10.0, "peak_memory_bytes": 7.0}),
               SimpleNamespace(memory={"param_bytes": 4.0, "peak_memory_bytes": 9.0}),
               SimpleNamespace(memory={})]
    assert rank_memory_metrics(results) == {
        "perf/rank_0_param_bytes": 10.0, "perf/rank_0_peak_memory_bytes": 7.0,
        "perf/rank_1_param_bytes": 4.0, "perf/rank_1_peak_memory_bytes": 9.0,
        "perf/max_rank_param_bytes": 10.0, "perf/max_rank_peak_memory_bytes": 9.0}


def train_once(base_model, world: int, tp: int, window: ProfileWindow | None = None):
    """One train call (two optimizer steps) of a Megatron group; its results (and with `window`,
    the window's summaries from each rank)."""
    cfg = config(world, train_backend="megatron", tensor_model_parallel_size=tp, **LOSS)
    group = ActorGroup(cfg, str(base_model))
    try:
        if window is not None:
            assert group.call("profile_open", window) == [True] * world
        samples, advantages = rollout_like()
        results = group.train(split_for_ranks(samples, advantages, cfg.global_batch_size, world,
                                              rollout_id=0))
        closed = group.call("profile_close") if window is not None else []
        return results, closed
    finally:
        group.stop()


def test_a_tp2_rank_holds_half_and_names_its_coordinates(ray_cluster, base_model, tmp_path):
    (single,), _ = train_once(base_model, 1, 1)
    window = ProfileWindow(start=0, end=1, targets=("train_actor",), ranks=(0, 1),
                           trace_root=str(tmp_path / "traces"), run_dir=str(tmp_path))
    split, closed = train_once(base_model, 2, 2, window)
    for kind in KINDS:
        assert single.memory[kind] > 0 and all(r.memory[kind] > 0 for r in split), kind
    for kind in ("param_bytes", "grad_bytes", "optimizer_bytes"):
        whole, shards = single.memory[kind], [r.memory[kind] for r in split]
        # the layers' and the (padded) vocabulary's halves; the norms are replicated on both ranks
        assert 0.45 * whole <= max(shards) <= 0.6 * whole, (kind, whole, shards)
        assert sum(shards) >= whole
    assert [r.rank_spans.coords.name for r in split] == ["node0/dp0/pp0/tp0", "node0/dp0/pp0/tp1"]
    assert [error for _, error in closed] == [None, None]
    traces = sorted(p.name for p in (tmp_path / "traces" / "train_actor_rollouts_0-1").iterdir())
    assert traces == ["rank0_dp0_pp0_tp0.pt.trace.json.gz", "rank1_dp0_pp0_tp1.pt.trace.json.gz"]
    for name in traces:
        with gzip.open(tmp_path / "traces" / "train_actor_rollouts_0-1" / name, "rt") as f:
            events = json.load(f)["traceEvents"]
        assert any(e.get("name") == "ProfilerStep#0" for e in events), name


def test_a_rank_without_model_parallelism_keeps_its_plain_name():
    window = ProfileWindow(start=0, end=1, targets=("train_actor",), ranks=(0,),
                           trace_root="/t", run_dir="/r")
    assert window.trace_path("train_actor", 3).name == "rank3.pt.trace.json.gz"
