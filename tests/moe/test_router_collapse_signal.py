"""The health watch's router_collapse signal on the routing of the tiny Qwen3-MoE's own training
forwards: a router forced onto one expert by its weights is a red flag naming the layer and the
expert; freshly initialised routers over a few seeds are not; dead experts growing is; the
reactions and `miles doctor`'s row are those of every signal."""
from __future__ import annotations

import random
from types import SimpleNamespace

import torch

from miles.config import parse_config
from miles.health import RED, Rollout, replay
from miles.health.cli import main as doctor
from miles.health.detectors import RunFacts
from miles.health.watch import health_metrics
from miles.moe.capture import RouterCapture
from miles.moe.routing_stats import routing_metrics
from miles.tiny.moe_model import build_tiny_moe_model
from miles.tiny.task import all_problems
from tests.support.runs import recorded

CFG = parse_config([]).health
RUN = RunFacts(clip_grad=1.0, groups_per_rollout=4, use_kl_loss=False)
W = CFG.health_router_collapse_window


def collapse_onto_expert_0(model) -> None:
    """Every token to expert 0 in every layer: a constant feature in the embeddings (dimension 0,
    far above the others, so the residual stream keeps it positive after each norm) and routers
    that read only that feature, for expert 0. The LM head (tied) adds the same to every logit."""
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 50.0
        for layer in model.model.layers:
            layer.mlp.gate.weight.zero_()
            layer.mlp.gate.weight[0, 0] = 10.0


def routing_rollouts(model, tokenizer, seed: int, n: int = W + 2) -> list[Rollout]:
    """`n` rollouts of the `moe/*` figures of a training forward over 16 sampled problems each."""
    capture = RouterCapture.attach(model)
    model.train()
    problems, rng = all_problems(), random.Random(seed)
    out = []
    for i in range(n):
        enc = tokenizer([p.prompt + p.label for p in rng.sample(problems, 16)], return_tensors="pt",
                        padding=True)
        model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
        out.append(Rollout(i, routing_metrics(capture.take())))
    capture.detach()
    return out


def collapses(rollouts, cfg=CFG):
    return [v for v in replay(rollouts, cfg, RUN) if v.signal == "router_collapse"]


def test_a_router_forced_onto_one_expert_is_a_red_flag():
    model, tokenizer = build_tiny_moe_model(0)
    collapse_onto_expert_0(model)
    rollouts = routing_rollouts(model, tokenizer, seed=0)
    assert all(r.metrics["moe/max_expert_share_layer_1"] == 1.0 for r in rollouts)
    flags = collapses(rollouts)
    assert [v.rollout_id for v in flags] == list(range(W - 1, len(rollouts)))  # once it held W
    first = flags[0]
    assert first.severity == RED
    assert "layer 0: expert 0 took 100.0% of the tokens" in first.message
    assert "layer 1: expert 0" in first.message
    assert first.values["moe/busiest_expert_layer_0"] == 0.0
    assert health_metrics([first], RUN)["health/router_collapse"] == 1.0
    assert "router_aux_loss_coef" in first.line()  # the WARN line carries the advice


def test_freshly_initialised_routers_raise_no_flag():
    """Random routers are lopsided on this task (an expert takes 60-90% of a layer's tokens, k/E =
    50% being even) but never all of it."""
    for seed in range(3):
        model, tokenizer = build_tiny_moe_model(seed)
        rollouts = routing_rollouts(model, tokenizer, seed)
        assert all(0.5 < r.metrics["moe/max_expert_share"] < 1.0 for r in rollouts)
        assert collapses(rollouts) == []


def layer_rows(shares: list[float], experts: list[int], dead: list[int]) -> list[Rollout]:
    return [Rollout(i, {"moe/max_expert_share_layer_3": s, "moe/busiest_expert_layer_3": float(e),
                        "moe/dead_experts_layer_3": float(d)})
            for i, (s, e, d) in enumerate(zip(shares, experts, dead))]


def test_the_share_must_hold_on_one_expert_for_the_window():
    n = W + 3
    lone = layer_rows([0.6] * 2 + [0.99] * (W - 1) + [0.6] * 2, [1] * n, [0] * n)
    assert collapses(lone) == []
    hopping = layer_rows([0.99] * n, [i % 2 for i in range(n)], [0] * n)
    assert collapses(hopping) == []
    held = layer_rows([0.99] * n, [2] * n, [0] * n)
    assert [v.rollout_id for v in collapses(held)] == list(range(W - 1, n))
    lax = CFG.__class__(health_router_max_share=0.995)
    assert collapses(held, lax) == []


def test_dead_experts_growing_is_a_red_flag_and_dead_from_the_start_is_not():
    grows = layer_rows([0.5] * 6, [0] * 6, [0, 0, 1, 1, 1, 2])
    flags = collapses(grows)
    assert [v.rollout_id for v in flags] == [1 + W]  # rollouts 2..4 above rollout 1's count
    assert "layer 3: dead experts 0 -> 1" in flags[0].message
    missed = layer_rows([0.5] * 6, [0] * 6, [0, 1, 0, 1, 0, 1])  # one rollout missed an expert
    assert collapses(missed) == []
    assert collapses(layer_rows([0.5] * 6, [0] * 6, [2] * 6)) == []


def test_doctor_row_and_the_reactions(tmp_path, capsys):
    from miles.health import HealthWatch
    from miles.run.observer import IterationResult
    from miles.run.red_flags import RedFlagProfiler, RedFlagStopper

    model, tokenizer = build_tiny_moe_model(0)
    healthy = routing_rollouts(model, tokenizer, seed=0)
    collapse_onto_expert_0(model)
    stuck = routing_rollouts(model, tokenizer, seed=0)
    recorded(tmp_path / "stuck", stuck)
    recorded(tmp_path / "healthy", healthy)
    recorded(tmp_path / "dense", [Rollout(i, {"train/loss": 0.1}) for i in range(3)])
    rows = {}
    for name in ("stuck", "healthy", "dense"):
        code = doctor([str(tmp_path / name)])
        rows[name] = code, next(ln for ln in capsys.readouterr().out.splitlines()
                                if ln.startswith("router_collapse "))
    assert rows["stuck"][0] == 1 and rows["stuck"][1].split()[1:3] == ["RED", str(W - 1)]
    assert rows["healthy"][1].split()[1] == "ok" and "expert share at most" in rows["healthy"][1]
    assert rows["dense"][1].split()[1] == "off"  # no moe/* keys: a dense model

    watch = HealthWatch(parse_config(["--on-red-flag", "stop"]), tmp_path / "stuck")
    stopper = RedFlagStopper(parse_config(["--on-red-flag", "stop"]))
    windows = []
    profiler = SimpleNamespace(request_window=lambda s, e: windows.append((s, e)) or
                               SimpleNamespace(start=s, end=e))
    profiling = RedFlagProfiler(parse_config(["--on-red-flag", "profile"]), profiler)
    reasons = []
    for r in stuck[:W]:
        report = watch.observe(r.rollout_id, r.metrics)
        result = IterationResult(r.rollout_id, r.metrics, [], report)
        reasons.append(stopper.after_iteration(result))
        profiling.after_iteration(result)
    assert reasons[:-1] == [None] * (W - 1) and "router_collapse at rollout" in reasons[-1]
    assert "expert 0" in reasons[-1] and windows == [(W, W + 2)]
