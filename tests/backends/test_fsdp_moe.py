"""The FSDP backend trains the tiny mixture-of-experts policy: its objective holds the routers'
load-balancing loss as megatron-core computes it (at the model's router_aux_loss_coef), the
log-probs and the reported loss do not, and a few steps change the weights with finite log-probs."""
import json
import math

import pytest
import torch

from miles.backends.fsdp.load_balancing import load_balancing_loss
from miles.backends.group import ActorGroup
from miles.tiny.moe_model import NUM_EXPERTS, TOP_K, build_tiny_moe_model
from tests.support.actors import config, rollout_like, step, weights


def test_the_load_balancing_loss_is_megatrons():
    from megatron.core.transformer.moe.moe_utils import switch_load_balancing_loss_func

    torch.manual_seed(0)
    layers = [torch.randn(37, NUM_EXPERTS) * 2 for _ in range(3)]
    theirs = 0.0
    for logits in layers:
        picks = torch.topk(logits, TOP_K, dim=-1).indices
        tokens_per_expert = torch.bincount(picks.reshape(-1), minlength=NUM_EXPERTS).float()
        theirs += switch_load_balancing_loss_func(torch.softmax(logits, -1), tokens_per_expert, 37,
                                                  TOP_K, NUM_EXPERTS, 1.0).item()
    assert load_balancing_loss(tuple(layers), TOP_K).item() == pytest.approx(theirs, rel=1e-6)
    even = torch.zeros(8, NUM_EXPERTS)  # uniform probabilities: 1 per layer, whatever the picks
    assert load_balancing_loss((even,), TOP_K).item() == pytest.approx(1.0)


def _moe_dir(tmp_path, coef: float):
    from miles.tiny.warmstart import save_checkpoint

    model, tokenizer = build_tiny_moe_model(0)
    with torch.no_grad():  # routers drawn at random: a zero router ties every expert
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.5)
    model.config.router_aux_loss_coef = coef
    out = tmp_path / f"moe-{coef}"
    save_checkpoint(model, tokenizer, out)
    assert json.loads((out / "config.json").read_text())["router_aux_loss_coef"] == coef
    return out


def _train(group, cfg, model_dir, steps: int = 2):
    """`steps` training calls from the base at `model_dir` (reloaded: fresh model, optimizer and
    seeds, as a new run's ranks start): the weights before, the results, the weights after."""
    group.call("load_base", str(model_dir))
    start = weights(group)
    results = [step(group, cfg, *rollout_like(seed=s)) for s in range(steps)]
    return start, results, weights(group)


def test_fsdp_trains_the_moe_policy_with_its_router_loss(ray_cluster, tmp_path):
    cfg = config(1, num_steps_per_rollout=1)  # one step of 8 micro-batches per call
    with_loss, without_loss = _moe_dir(tmp_path, 0.5), _moe_dir(tmp_path, 0.0)
    group = ActorGroup(cfg, str(with_loss))
    try:
        start, runs, end = _train(group, cfg, with_loss)
        _, without, end_without = _train(group, cfg, without_loss)
    finally:
        group.stop()
    changed = [k for k in start if not torch.equal(start[k], end[k])]
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in changed)
    assert any(k.endswith("mlp.gate.weight") for k in changed)
    for run in runs:
        assert all(math.isfinite(v) for v in run.metrics.values())
        assert math.isfinite(run.metrics["rollout/log_probs"])
    # the first pass's log-probs and reported loss are the same with and without the router loss ...
    for key in ("rollout/log_probs", "train/loss", "train/pg_loss"):
        assert runs[0].metrics[key] == pytest.approx(without[0].metrics[key], rel=1e-6), key
    # ... while the step it takes is not: the routers' gradient holds the load-balancing loss
    gate = "model.layers.0.mlp.gate.weight"
    assert (end[gate] - end_without[gate]).abs().max() > 1e-5
