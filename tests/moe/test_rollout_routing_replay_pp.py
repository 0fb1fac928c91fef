"""Rollout routing replay (R3) through Megatron's pipeline: the tiny MoE policy served by the
embedded engine in bfloat16 (its records of every token's experts), trained in float32 by two
pipeline stages (one MoE layer each) and by one rank holding both, with and without
--use-rollout-routing-replay. Each stage's routers follow their own columns of the record in the
log-prob, reference and training passes (8 micro-batches through megatron-core's 1F1B schedule per
pass), and train/r3_mismatch_fraction, counted per stage and added over the pipeline, is PP=1's, as
are the log-probs."""
from __future__ import annotations

import numpy as np
import pytest
import ray
import torch

from miles.backends.group import ActorGroup
from miles.backends.pack import split_for_ranks
from miles.config import parse_config
from miles.moe.megatron_replay import MegatronRoutingReplay
from miles.moe.replay import METRIC
from tests.support.actors import LOSS
from tests.support.moe import engine_rollout, moe_checkpoint
from tests.moe.replay_ranks import strays, watching_ranks

PROMPTS = ["12+13=", "1+2=", "99+1=", "7+8="]
PER_PROMPT = 4
SAMPLES = len(PROMPTS) * PER_PROMPT
LOG_PROB_SUMS = ("rollout/log_probs", "rollout/ref_log_probs",
                 "train/train_rollout_logprob_abs_diff")


def config(pp: int, replay: bool):
    argv = ["--train-backend", "megatron", "--actor-num-gpus-per-node", str(pp),
            "--pipeline-model-parallel-size", str(pp), "--rollout-batch-size", str(len(PROMPTS)),
            "--n-samples-per-prompt", str(PER_PROMPT), "--micro-batch-size", "2",
            "--num-steps-per-rollout", "2"]
    argv += [a for key, value in LOSS.items() for a in (f"--{key.replace('_', '-')}", str(value))]
    return parse_config(argv + (["--use-rollout-routing-replay"] if replay else []))


def trained(pp: int, weights, samples, advantages) -> dict[bool, tuple]:
    """replay -> (the reporting rank's result, each rank's passes): one group of `pp` stages,
    trained from the engine's weights without and then with replay."""
    with watching_ranks():
        group = ActorGroup(config(pp, False), str(weights))
    try:
        out = {}
        for replay in (False, True):
            cfg = config(pp, replay)
            batches = split_for_ranks(samples, advantages, cfg.global_batch_size, pp, 0,
                                      return_token_stats=True)
            ranks = ray.get([a.train_watched.remote(cfg, str(weights), b)
                             for a, b in zip(group.actors, batches)])
            (reported,) = [r for r, _ in ranks if r.num_samples]  # the last stage's
            out[replay] = (reported, [passes for _, passes in ranks])
        return out
    finally:
        group.stop()


@pytest.fixture(scope="module")
def runs(ray_cluster, tmp_path_factory):
    weights = moe_checkpoint(tmp_path_factory.mktemp("r3-pp") / "engine")
    samples = engine_rollout(weights, PROMPTS, PER_PROMPT)
    advantages = [float(a) for a in np.random.default_rng(0).standard_normal(SAMPLES)]
    return {pp: trained(pp, weights, samples, advantages) for pp in (1, 2)}


@pytest.mark.slow
def test_each_stage_routes_every_read_token_to_the_engines_experts(runs):
    _, ranks = runs[2][True]
    for stage, passes in enumerate(ranks):
        assert [p["model"] for p in passes] == ["policy", "reference", "policy", "policy"]
        assert [len(p["records"]) for p in passes] == [8, 8, 4, 4]
        assert {layer for p in passes for layer, _ in p["calls"]} == {stage}  # its own layer
        stray, read = strays(passes)
        assert read > 0 and stray == 0, f"stage {stage}: {stray} of {read} tokens stray"
    # without replay the stages' own routers choose otherwise somewhere: the check above can fail
    assert sum(strays(passes)[0] for passes in runs[2][False][1]) > 0


@pytest.mark.slow
@pytest.mark.parametrize("replay", [False, True])
def test_two_stages_count_the_mismatch_and_score_as_one_rank(runs, replay):
    one, two = runs[1][replay][0], runs[2][replay][0]
    assert one.sums[METRIC] > 0  # bf16 engine, fp32 trainer: some routings differ
    assert two.sums[METRIC] / SAMPLES == pytest.approx(one.sums[METRIC] / SAMPLES, abs=1e-5)
    for key in LOG_PROB_SUMS:
        assert two.sums[key] / SAMPLES == pytest.approx(one.sums[key] / SAMPLES, abs=1e-5), key
    assert one.token_stats.keys() == two.token_stats.keys() and len(one.token_stats) == SAMPLES
    for index, stats in one.token_stats.items():
        got = two.token_stats[index]["log_probs"]
        assert got == pytest.approx(stats["log_probs"], abs=1e-5), index


@pytest.mark.slow
def test_replay_brings_the_pipelines_log_probs_closer_to_the_engines(runs):
    key = "train/train_rollout_logprob_abs_diff"
    assert runs[2][True][0].sums[key] < runs[2][False][0].sums[key]


def test_a_schedule_out_of_step_with_the_records_stops_the_pass():
    """The queue's order is the schedule's: a stage whose forwards came in another order (here the
    second micro-batch's shape first) or fewer than the records stops with an error, rather than
    replaying one micro-batch's experts on another's tokens."""
    replay = MegatronRoutingReplay({}, num_layers=2)  # a stage with its model hook, no routers
    stage = torch.nn.Identity()
    stage.register_forward_pre_hook(replay._next_micro_batch)
    records = [torch.zeros((2, 5, 2, 2), dtype=torch.int8),
               torch.zeros((2, 7, 2, 2), dtype=torch.int8)]
    with pytest.raises(RuntimeError, match="out of step with the schedule"):
        with replay.passing(records, replay=True):
            stage(torch.zeros(2, 7))
    with pytest.raises(RuntimeError, match="ran 1 of this pass's 2 micro-batches"):
        with replay.passing(records, replay=True):
            stage(torch.zeros(2, 5))
    with replay.passing(records, replay=True):
        stage(torch.zeros(2, 5))
        stage(torch.zeros(2, 7))
    assert [c.shape for c in replay.counts] == [(2, 5), (2, 7)]
