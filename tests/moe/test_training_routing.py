"""The routing figures of real training passes over the tiny Qwen3-MoE: two FSDP ranks count each
real token once per layer and the driver adds their counts; Megatron (EP=2: the experts split, the
tokens sent all-to-all, its routers laying tokens out sequence-major and its forward given no
attention mask) counts the same routing as FSDP on the same samples and weights, and so do its
two pipeline stages at PP=2, each counting its own layer."""
from __future__ import annotations

import pytest

from miles.backends.group import ActorGroup
from miles.backends.pack import split_for_ranks
from miles.moe.routing_stats import merge_ranks, rank_routing_metrics
from miles.tiny.moe_model import build_tiny_moe_model
from tests.support.actors import config, rollout_like


@pytest.fixture(scope="module")
def moe_base(tmp_path_factory):
    from miles.tiny.warmstart import save_checkpoint

    path = tmp_path_factory.mktemp("tiny-moe") / "model"
    save_checkpoint(*build_tiny_moe_model(0), path)
    return path


def train_once(base, **flags):
    """One training call on two ranks (one optimizer step: its forward sees the base weights)."""
    cfg = config(2, num_steps_per_rollout=1, **flags)
    samples, advantages = rollout_like()
    group = ActorGroup(cfg, str(base))
    try:
        batches = split_for_ranks(samples, advantages, cfg.global_batch_size, 2, 0)
        return group.train(batches)
    finally:
        group.stop()


@pytest.fixture(scope="module")
def fsdp(ray_cluster, moe_base):
    return train_once(moe_base)


def test_fsdp_ranks_report_routing_counts(fsdp):
    """Each rank counts its own half of the samples in both MoE layers (the log-prob pass over
    the same samples is not counted again); the sum holds every real token once per layer, two
    top-2 picks each."""
    tokens = sum(len(s.tokens) for s in rollout_like()[0])
    assert [sorted(r.routing) for r in fsdp] == [[0, 1], [0, 1]]
    assert all(0 < r.routing[0].tokens < tokens for r in fsdp)  # each rank routed its own half
    for layer, r in merge_ranks([r.routing for r in fsdp]).items():
        assert r.tokens == tokens and sum(r.counts) == 2 * tokens, layer
    m = rank_routing_metrics(fsdp)
    assert m["moe/routed_tokens"] == tokens and "moe/load_balancing_loss_layer_1" in m
    assert 1.0 <= m["moe/load_balancing_loss"] <= 2.0  # between balanced (1) and collapsed (E/k)
    assert 0.5 <= m["moe/max_expert_share"] <= 1.0  # k/E at best


def test_megatron_ep2_counts_the_routing_fsdp_counts(fsdp, moe_base):
    megatron = train_once(moe_base, train_backend="megatron", expert_model_parallel_size=2)
    got, want = merge_ranks([r.routing for r in megatron]), merge_ranks([r.routing for r in fsdp])
    assert sorted(got) == sorted(want) == [0, 1]
    for layer in want:
        assert (got[layer].tokens, got[layer].counts) == (want[layer].tokens, want[layer].counts)
        assert got[layer].prob_sums == pytest.approx(want[layer].prob_sums, rel=1e-4)
        assert got[layer].entropy_sum == pytest.approx(want[layer].entropy_sum, rel=1e-4)
    m, f = rank_routing_metrics(megatron), rank_routing_metrics(fsdp)
    assert m.keys() == f.keys()
    assert all(m[k] == pytest.approx(f[k], rel=1e-4) for k in f)


@pytest.mark.slow
def test_megatron_pp2_stages_each_count_their_own_layer(fsdp, moe_base):
    """PP=2: each stage reports its own layer, by its global index, and the counts are FSDP's.
    (A tensor-parallel peer would route its TP rank 0's tokens again and reports none:
    routes_own_tokens; this build trains MoE models at TP = 1 only.)"""
    ranks = train_once(moe_base, train_backend="megatron", pipeline_model_parallel_size=2)
    assert [sorted(r.routing) for r in ranks] == [[0], [1]]
    got, want = merge_ranks([r.routing for r in ranks]), merge_ranks([r.routing for r in fsdp])
    for layer in want:
        assert (got[layer].tokens, got[layer].counts) == (want[layer].tokens, want[layer].counts)
        assert got[layer].prob_sums == pytest.approx(want[layer].prob_sums, rel=1e-4)
