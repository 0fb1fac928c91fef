"""The routing capture on the tiny Qwen3-MoE itself: it counts what the routers did on the real
tokens of training forwards only, and a dense model gets no hooks."""
from __future__ import annotations

import pytest
import torch

from miles.moe.capture import RouterCapture
from miles.moe.routing_stats import layer_routing, routing_metrics
from miles.tiny.moe_model import build_tiny_moe_model


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 30, (3, 12), generator=g)
    attn = torch.ones_like(ids)
    attn[1, 7:] = 0  # right padding, as micro-batches are collated
    attn[2, 10:] = 0
    return ids, attn


def test_counts_equal_the_routers_own_logits():
    """Two micro-batches of a training forward: the sums equal those worked out from the router
    logits transformers returns (output_router_logits), on the real tokens only."""
    model, _ = build_tiny_moe_model(0)
    capture = RouterCapture.attach(model)
    model.train()
    expected = {}
    for seed in (1, 2):
        ids, attn = batch(seed)
        out = model(input_ids=ids, attention_mask=attn, output_router_logits=True)
        for layer, logits in enumerate(out.router_logits):
            probs = torch.softmax(logits.float(), dim=-1)
            r = layer_routing(probs, probs.topk(2, dim=-1).indices, attn)
            expected[layer] = expected[layer] + r if layer in expected else r
    got = capture.take()
    assert sorted(got) == [0, 1]
    for layer, r in got.items():
        assert (r.tokens, r.counts) == (expected[layer].tokens, expected[layer].counts)
        assert r.prob_sums == pytest.approx(expected[layer].prob_sums)
        assert r.entropy_sum == pytest.approx(expected[layer].entropy_sum)
    assert capture.take() == {}  # taking starts anew


def test_log_prob_passes_are_not_counted():
    model, _ = build_tiny_moe_model(0)
    capture = RouterCapture.attach(model)
    ids, attn = batch(1)
    model.eval()
    with torch.no_grad():
        model(input_ids=ids, attention_mask=attn)
    model.train()
    with torch.no_grad():  # a training-mode pass without gradients (a reference score) neither
        model(input_ids=ids, attention_mask=attn)
    assert capture.take() == {}
    model(input_ids=ids, attention_mask=attn)
    assert routing_metrics(capture.take())["moe/routed_tokens"] == float(attn.sum())
    capture.detach()
    model(input_ids=ids, attention_mask=attn)
    assert capture.take() == {}


def test_dense_model_gets_no_hooks():
    from miles.tiny.model import build_tiny_model

    model, _ = build_tiny_model(0)
    assert RouterCapture.attach(model) is None


def test_with_replay_the_capture_counts_the_replayed_experts():
    """R3's hooks run before the capture's: the figures are of the routing the step used (the
    engine's experts 2 and 3 for every token read), whatever the trainer's router preferred."""
    from miles.moe.replay import RoutingReplay

    model, _ = build_tiny_moe_model(0)
    capture = RouterCapture.attach(model)
    replay = RoutingReplay.attach(model)  # attached after, its hooks still run first
    ids, attn = batch(1)
    record = torch.tensor([2, 3]).expand(*ids.shape, 2, 2).clone()  # (B, T, layers, top_k)
    model.train()
    with replay.following(record, replay=True):
        model(input_ids=ids, attention_mask=attn)
    for r in capture.take().values():
        assert r.counts[:2] == [0, 0] and r.counts[2] == r.counts[3] == r.tokens == int(attn.sum())
    model(input_ids=ids, attention_mask=attn)  # the router's own choice again: not only 2 and 3
    assert any(r.counts[:2] != [0, 0] for r in capture.take().values())
