"""benchmarks/parallel_layouts.py's parts that are not timings: every layout it runs is one the
flags accept as that layout (a renamed or tightened flag breaks the benchmark here, not after
minutes of starting ranks), and its ratios are taken against the right baseline."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.parallel_layouts import (BY_KEY, LAYOUTS, layout_config, layout_ratios,  # noqa: E402
                                         mode_key, push_ratios, summarize_memory)


@pytest.mark.parametrize("layout", LAYOUTS, ids=[layout.key for layout in LAYOUTS])
def test_each_layout_parses_as_itself(layout):
    for mode, bucket in (("disk", None), ("broadcast", 2**18)):
        cfg = layout_config(layout, mode, bucket)
        t = cfg.train
        assert (cfg.world_size, t.tensor_model_parallel_size, t.pipeline_model_parallel_size,
                t.expert_model_parallel_size, t.sequence_parallel) == \
            (layout.world, layout.tp, layout.pp, layout.ep, layout.sp)
        assert t.train_backend == "megatron" and t.update_weight_transfer_mode == mode
    assert layout_config(layout, "broadcast", 2**18).train.update_weight_buffer_size == 2**18
    assert BY_KEY[layout.baseline].world == 1 and BY_KEY[layout.baseline].moe == layout.moe


def test_ratios_are_the_most_one_rank_holds_over_the_single_rank():
    one = {"memory": summarize_memory([{"param_bytes": 100.0, "grad_bytes": 100.0,
                                        "optimizer_bytes": 200.0, "peak_memory_bytes": 1e3}]),
           "step_s": 2.0, "log_probs_s": 1.0}
    shards = [{"param_bytes": 52.0, "grad_bytes": 52.0, "optimizer_bytes": 104.0,
               "peak_memory_bytes": 900.0},
              {"param_bytes": 50.0, "grad_bytes": 50.0, "optimizer_bytes": 100.0,
               "peak_memory_bytes": 950.0}]
    tp2 = {"memory": summarize_memory(shards), "step_s": 1.0, "log_probs_s": 2.0}
    assert tp2["memory"]["all_ranks_param_bytes"] == 102.0
    assert layout_ratios(tp2, one) == {"param_bytes_vs_1rank": 0.52, "grad_bytes_vs_1rank": 0.52,
                                       "optimizer_bytes_vs_1rank": 0.52,
                                       "peak_memory_bytes_vs_1rank": 0.95,
                                       "step_vs_1rank": 0.5, "log_probs_vs_1rank": 2.0}
    pushes = {"disk": {"gb_per_s": 0.5}, mode_key("broadcast", 2**29): {"gb_per_s": 1.0}}
    assert mode_key("broadcast", 2**29) == "broadcast_512MiB"
    assert mode_key("broadcast", 2**18) == "broadcast_256KiB"
    assert push_ratios(pushes, copy_gbps=4.0) == {
        "disk_over_copy": 0.125, "broadcast_512MiB_over_copy": 0.25,
        "broadcast_512MiB_over_disk": 2.0}
