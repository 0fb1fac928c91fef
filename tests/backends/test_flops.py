"""The FLOP count behind perf/mfu: counted from the config, it equals what torch's FlopCounterMode counts
on the real tiny model (forward, and forward + backward = three forwards), and MFU divides by the peak."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM

from miles.backends.flops import (ModelShape, RankShare, gpu_peak_flops, measured_peak_flops,
                                  mfu_metrics, rank_peak_flops)


@pytest.fixture(scope="module")
def tiny(base_model):
    model = AutoModelForCausalLM.from_pretrained(str(base_model), dtype=torch.float32, attn_implementation="eager")
    return model, ModelShape.from_checkpoint(base_model)


@pytest.mark.parametrize("lengths", [[17], [9, 30]])
def test_forward_and_training_flops_match_torch_flop_counter(tiny, lengths):
    model, shape = tiny
    counted_forward = counted_train = 0
    for n in lengths:  # one sequence at a time: padding would add FLOPs nobody asked for
        ids = torch.randint(3, shape.vocab, (1, n))
        with FlopCounterMode(display=False) as counter:
            model(input_ids=ids)
        counted_forward += counter.get_total_flops()
        with FlopCounterMode(display=False) as counter:
            model(input_ids=ids).logits.float().sum().backward()
        counted_train += counter.get_total_flops()
    # eager attention multiplies the whole (masked) square: the dense count; the causal count is below it
    assert shape.forward_flops(lengths, causal=False) == counted_forward
    assert shape.train_flops(lengths) < 3 * counted_forward
    # backward: two matmuls per forward matmul (the input's and the weight's gradient): 3x forward in all
    assert 3 * shape.forward_flops(lengths, causal=False) == counted_train


def test_a_mixture_of_experts_counts_its_router_and_the_chosen_experts():
    """The tiny Qwen3-MoE: each token through the router and its 2 of 4 experts (HF runs only the
    experts a token is routed to), as torch's counter sees it."""
    from miles.tiny.moe_model import build_tiny_moe_model

    model, _ = build_tiny_moe_model(0)
    model.config._attn_implementation = "eager"
    model.config._experts_implementation = "eager"  # torch's counter does not see grouped_mm
    shape = ModelShape.from_config(model.config.to_dict())
    assert (shape.ffn, shape.experts) == (2 * 192, 4)
    ids = torch.randint(3, shape.vocab, (1, 13))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids)
    assert shape.forward_flops([13], causal=False) == counter.get_total_flops()


def test_mfu_is_achieved_over_peak_per_rank(tiny):
    _, shape = tiny
    lens = [[20, 20], [40]]
    out = mfu_metrics(shape, lens, [2.0, 4.0], [1e12, 2e12])
    first = shape.train_flops([20, 20]) / 2.0
    second = shape.train_flops([40]) / 4.0
    assert out["perf/rank_0_tflops"] == pytest.approx(first / 1e12)
    assert out["perf/rank_0_mfu"] == pytest.approx(first / 1e12)
    assert out["perf/rank_1_mfu"] == pytest.approx(second / 2e12)
    assert out["perf/tflops"] == pytest.approx((first + second) / 1e12)
    assert out["perf/mfu"] == pytest.approx((first + second) / 3e12)
    assert "perf/rank_0_mfu" not in mfu_metrics(shape, [[], [40]], [0.0, 1.0], [1e12, 1e12])


def test_peaks_from_the_table_or_measured():
    assert gpu_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert gpu_peak_flops("NVIDIA H100 PCIe") == 756e12
    assert gpu_peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert gpu_peak_flops("Some Future Accelerator") is None
    peak, source = rank_peak_flops(torch.device("cpu"))
    assert source == "measured:cpu-fp32-matmul" and peak > 1e8  # any CPU of this century does 0.1 GFLOP/s
    assert measured_peak_flops("cpu", torch.get_num_threads()) == peak  # measured once, then remembered


def test_a_config_without_the_shape_is_a_clear_error():
    with pytest.raises(ValueError, match="lacks what a FLOP count needs"):
        ModelShape.from_config({"hidden_size": 8})


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2), (2, 2), (4, 3)])
def test_the_ranks_of_a_tp_pp_layout_add_up_to_the_whole_model(tiny, tp, pp):
    """Each rank counts 1/TP of its stage's layers, the LM head on the last stage only: the TP x PP
    ranks of one replica together do the model's FLOPs once (not TP x PP times)."""
    _, whole = tiny
    shape = ModelShape(layers=12, hidden=whole.hidden, heads=whole.heads, kv_heads=whole.kv_heads,
                       head_dim=whole.head_dim, ffn=whole.ffn, vocab=whole.vocab)
    lens = [17, 30]
    shares = [RankShare(tp, pp, stage) for stage in range(pp) for _ in range(tp)]
    total = sum(shape.train_flops(lens, s) for s in shares)
    assert total == pytest.approx(shape.train_flops(lens), rel=1e-12)
    if tp > 1:
        one = shape.train_flops(lens, RankShare(tp, 1, 0))
        assert one == pytest.approx(shape.train_flops(lens) / tp)
    if pp > 1:  # the last stage also runs the LM head, the first only its layers
        first, last = (shape.train_flops(lens, RankShare(tp, pp, r)) for r in (0, pp - 1))
        head = 3 * 2.0 * shape.hidden * shape.vocab * sum(lens) / tp
        assert last - first == pytest.approx(head)


def test_mfu_counts_each_ranks_share_from_its_layout(tiny):
    _, shape = tiny
    parallel = [{"tp_rank": r, "pp_rank": 0, "dp_rank": 0, "tp_size": 2, "pp_size": 1}
                for r in (0, 1)]
    shares = [RankShare.of(p) for p in parallel]
    assert RankShare.of(None) == RankShare() and shares[0] == RankShare(2, 1, 0)
    lens = [[40, 40], [40, 40]]  # both ranks of the replica train its two sequences
    out = mfu_metrics(shape, lens, [1.0, 1.0], [1e12, 1e12], shares)
    assert out["perf/rank_0_tflops"] == pytest.approx(shape.train_flops([40, 40]) / 2 / 1e12)
    assert out["perf/tflops"] == pytest.approx(shape.train_flops([40, 40]) / 1e12)
    assert out["perf/mfu"] == pytest.approx(shape.train_flops([40, 40]) / 2e12)
