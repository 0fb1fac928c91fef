"""The routing figures of a real FSDP training pass over the tiny Qwen3-MoE on two ranks: the
ranks' counts add up, each real token counted once per layer."""
from __future__ import annotations

import pytest

from miles.backends.group import ActorGroup
from miles.backends.pack import split_for_ranks
from miles.moe.routing_stats import merge_ranks, rank_routing_metrics
from miles.tiny.moe_model import build_tiny_moe_model
from tests.support.actors import config, rollout_like


@pytest.fixture(scope="module")
def moe_base(tmp_path_factory):
    model, tokenizer = build_tiny_moe_model(0)
    path = tmp_path_factory.mktemp("tiny-moe")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def train_once(world_size: int, base, samples, advantages):
    cfg = config(world_size)
    group = ActorGroup(cfg, str(base))
    try:
        batches = split_for_ranks(samples, advantages, cfg.global_batch_size, world_size, 0)
        return group.train(batches)
    finally:
        group.stop()


def test_fsdp_ranks_report_routing_counts(ray_cluster, moe_base):
    """Two FSDP ranks, two optimizer steps: each rank counts its own half of the samples in both
    MoE layers (the log-prob pass over the same samples is not counted again), and the driver's
    sum holds every real token once per layer, two top-2 picks each."""
    samples, advantages = rollout_like()
    tokens = sum(len(s.tokens) for s in samples)
    results = train_once(2, moe_base, samples, advantages)
    assert [sorted(r.routing) for r in results] == [[0, 1], [0, 1]]
    assert all(0 < r.routing[0].tokens < tokens for r in results)  # each rank routed its own half
    merged = merge_ranks([r.routing for r in results])
    for layer, r in merged.items():
        assert r.tokens == tokens and sum(r.counts) == 2 * tokens, layer
    m = rank_routing_metrics(results)
    assert m["moe/routed_tokens"] == tokens and "moe/load_balancing_loss_layer_1" in m
    assert 1.0 <= m["moe/load_balancing_loss"] <= 2.0  # between balanced (1) and collapsed (E/k)
    assert 0.5 <= m["moe/max_expert_share"] <= 1.0  # k/E at best
