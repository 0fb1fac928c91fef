"""The routing figures of miles.moe.routing_stats against numbers worked out by hand."""
from __future__ import annotations

import math

import pytest
import torch

from miles.moe.routing_stats import (LayerRouting, layer_figures, layer_routing,
                                     load_balancing_loss, merge_ranks, routing_metrics)

# 4 experts, top-2; three real tokens and one padding token (which routes to experts 3 and 2)
PROBS = torch.tensor([[0.5, 0.3, 0.1, 0.1],
                      [0.4, 0.4, 0.1, 0.1],
                      [0.1, 0.2, 0.3, 0.4],
                      [0.0, 0.0, 0.0, 1.0]])
CHOSEN = torch.tensor([[0, 1], [0, 1], [3, 2], [3, 2]])
REAL = torch.tensor([1, 1, 1, 0])


def h(*p: float) -> float:
    return -sum(x * math.log(x) for x in p if x > 0)


def test_one_layer_by_hand():
    r = layer_routing(PROBS, CHOSEN, REAL)
    assert (r.tokens, r.counts) == (3, [2, 2, 1, 1])  # the padding token is not counted
    assert r.prob_sums == pytest.approx([1.0, 0.9, 0.5, 0.6])
    f = layer_figures(r)
    # f = picks / (3 tokens * 2) = [1/3, 1/3, 1/6, 1/6]; P = prob sums / 3 = [1/3, 0.3, 1/6, 0.2]
    # 4 * (1/9 + 1/10 + 1/36 + 1/30) = 4 * 49/180
    assert f["load_balancing_loss"] == pytest.approx(49 / 45)
    assert (f["tokens_per_expert_max"], f["tokens_per_expert_min"]) == (2.0, 1.0)
    assert f["expert_imbalance"] == pytest.approx(2 / 1.5)  # mean = 6 picks / 4 experts
    assert f["max_expert_share"] == pytest.approx(2 / 3) and f["busiest_expert"] == 0.0
    assert f["dead_experts"] == 0.0
    entropy = (h(0.5, 0.3, 0.1, 0.1) + h(0.4, 0.4, 0.1, 0.1) + h(0.1, 0.2, 0.3, 0.4)) / 3
    assert f["router_entropy"] == pytest.approx(entropy) and 1.21 < entropy < 1.22


def test_balanced_and_collapsed_bounds():
    """Even routing gives a loss of 1 and imbalance 1; every token on experts 0 and 1 gives E / k,
    two dead experts and a share of 1."""
    uniform = torch.full((8, 4), 0.25)
    spread = torch.tensor([[0, 1], [2, 3]] * 4)
    even = layer_figures(layer_routing(uniform, spread))
    assert even["load_balancing_loss"] == pytest.approx(1.0)
    assert even["expert_imbalance"] == 1.0 and even["max_expert_share"] == 0.5
    assert even["router_entropy"] == pytest.approx(math.log(4))
    stuck = layer_figures(layer_routing(torch.tensor([[0.5, 0.5, 0.0, 0.0]] * 8),
                                        torch.tensor([[0, 1]] * 8)))
    assert stuck["load_balancing_loss"] == pytest.approx(4 / 2)
    assert stuck["dead_experts"] == 2 and stuck["max_expert_share"] == 1
    assert stuck["expert_imbalance"] == 2
    assert stuck["router_entropy"] == pytest.approx(math.log(2))


def test_ranks_add_counts_not_ratios():
    """Two ranks' halves give the figures of one pass over all tokens; averaging the ranks' own
    losses would not (each half is lopsided the other way)."""
    a = layer_routing(PROBS[:2], CHOSEN[:2])
    b = layer_routing(PROBS[2:3], CHOSEN[2:3])
    whole = layer_routing(PROBS[:3], CHOSEN[:3])
    merged = merge_ranks([{0: a}, None, {0: b}])[0]
    assert (merged.tokens, merged.counts) == (whole.tokens, whole.counts)
    assert load_balancing_loss(merged) == pytest.approx(load_balancing_loss(whole))
    mean_of_ranks = (load_balancing_loss(a) + load_balancing_loss(b)) / 2
    assert load_balancing_loss(merged) != pytest.approx(mean_of_ranks)


def test_metric_names_and_summary():
    layers = {0: layer_routing(PROBS, CHOSEN, REAL),
              1: LayerRouting(2, 3, [3, 3, 0, 0], [1.5, 1.5, 0.0, 0.0], 3 * math.log(2))}
    m = routing_metrics(layers)
    assert m["moe/load_balancing_loss_layer_0"] == pytest.approx(49 / 45)
    assert m["moe/load_balancing_loss_layer_1"] == pytest.approx(2.0)
    assert m["moe/load_balancing_loss"] == pytest.approx((49 / 45 + 2.0) / 2)  # mean over layers
    assert m["moe/dead_experts"] == 2.0 and m["moe/dead_experts_layer_1"] == 2.0
    assert m["moe/max_expert_share"] == 1.0 and m["moe/expert_imbalance"] == 2.0  # the worst layer
    assert m["moe/routed_tokens"] == 3.0
    assert routing_metrics({}) == {}  # a dense model logs none


def test_layers_of_different_shapes_do_not_add():
    with pytest.raises(ValueError, match="top-1 over 2 experts to top-2 over 4"):
        LayerRouting(2, 1, [1, 1, 0, 0], [0.5, 0.5, 0.0, 0.0], 0.0) + \
            LayerRouting(1, 1, [1, 0], [1.0, 0.0], 0.0)


def test_the_stdout_row_of_an_moe_policy_shows_its_routers():
    from miles.record.row import format_row

    layers = {0: layer_routing(PROBS, CHOSEN, REAL),
              1: LayerRouting(2, 3, [3, 3, 0, 0], [1.5, 1.5, 0.0, 0.0], 3 * math.log(2))}
    row = format_row(3, 10, {"train/loss": 0.1, **routing_metrics(layers)}, show_kl=False)
    third = row.splitlines()[2]
    assert "load_balancing_loss=1.544 max_expert_share=1.00 dead_experts=2" in third
    assert "load_balancing_loss" not in format_row(3, 10, {"train/loss": 0.1}, show_kl=False)
