"""Megatron-core's MoE layer with expert parallelism on gloo (CPU), for the tiny Qwen3-MoE policy:
the HF <-> Megatron expert conversion (whole, and each EP x TP x PP rank's shard) is exact; the EP=1
model's log-probs are HF's; EP=2 (2 ranks, the experts split, tokens sent all-to-all) takes the step
EP=1 takes on the same batch (loss, log-probs, grad norm; weights after three optimizer steps), as
do PP=2 (the MoE layers in two pipeline stages) and TP=2 with sequence parallel (the experts cut
over TP, each TP rank routing its own chunk of the sequence, the router's gradient summed); the
export gathers every expert into the HF state dict, exactly, and an EP=2 checkpoint resumes bit
for bit; bad --expert-model-parallel-size values (and a MoE model at TP > 1 without
--sequence-parallel) are refused by name. The routing figures of those real training passes: two
FSDP ranks count each real token once per layer and the driver adds their counts; Megatron at EP=2
(its routers laying tokens out sequence-major, its forward given no attention mask) counts the same
routing as FSDP on the same samples and weights, and so do its two pipeline stages at PP=2, each
counting its own layer (read from the first training call of the EP=2 and PP=2 runs above, whose
forward sees the base weights: one group per layout serves both checks)."""
import itertools

import pytest
import torch

from miles import preflight
from miles.backends.group import ActorGroup
from miles.backends.megatron import convert
from miles.backends.pack import combine, split_for_ranks
from miles.config import ConfigError, MilesConfig, TrainConfig, parse_config
from miles.moe.routing_stats import merge_ranks, rank_routing_metrics
from miles.tiny.model import tiny_shape
from miles.tiny.moe_model import build_tiny_moe_model, tiny_moe_shape
from tests.support.actors import LOSS, config, max_abs_diff, rollout_like

STEPS = 3
EP_FLAG = "--expert-model-parallel-size"


# ---- conversion ---------------------------------------------------------------------------------
def test_expert_conversion_round_trips_for_every_layout():
    model, _ = build_tiny_moe_model(0)
    lay, state = convert.Layout.of(model.config), model.state_dict()
    assert lay.num_experts == 4
    whole = convert.hf_to_megatron(state, lay)
    fc1 = whole["decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight"]
    assert torch.equal(fc1, state["model.layers.1.mlp.experts.gate_up_proj"][2])  # [gate; up]
    assert torch.equal(whole["decoder.layers.0.mlp.router.weight"],
                       state["model.layers.0.mlp.gate.weight"])
    back = convert.megatron_to_hf(whole, lay)
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)
    for tp, pp, ep in itertools.product((1, 2), (1, 2), (1, 2, 4)):
        shards = {(t, p, e): convert.hf_to_megatron_shard(state, lay,
                                                          convert.Parallel(tp, t, pp, p, ep, e))
                  for t, p, e in itertools.product(range(tp), range(pp), range(ep))}
        one = shards[(tp - 1, 0, ep - 1)]  # the last EP rank's experts, numbered from 0
        experts = {k for k in one if convert.is_expert(k) and ".layers.0." in k}
        assert len(experts) == 2 * 4 // ep
        first = state["model.layers.0.mlp.experts.down_proj"][4 - 4 // ep]
        assert torch.equal(one["decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.weight"],
                           first.chunk(tp, dim=1)[tp - 1])
        if ep == 1:
            shards = {(t, p): s for (t, p, _), s in shards.items()}
        back = convert.megatron_shards_to_hf(shards, lay, tp, pp, ep)
        assert back.keys() == state.keys(), (tp, pp, ep)
        assert all(torch.equal(back[k], state[k]) for k in state), (tp, pp, ep)
    for name in state:
        assert convert.megatron_source(name, lay) in whole


def test_save_pretrained_per_expert_files_are_fused_as_in_memory(tmp_path):
    from safetensors.torch import load_file

    model, _ = build_tiny_moe_model(1)
    model.save_pretrained(tmp_path)
    files = load_file(str(tmp_path / "model.safetensors"))
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in files  # transformers 5's file names
    lay = convert.Layout.of(model.config)
    fused = convert.fuse_expert_files(files, lay)
    state = model.state_dict()
    assert fused.keys() == state.keys() - {"lm_head.weight"}
    assert all(torch.equal(fused[k], state[k]) for k in fused)
    assert convert.fuse_expert_files(fused, lay) == fused


def test_each_rank_has_the_names_and_shapes_megatron_core_builds(one_rank_moe):
    from miles.backends.megatron.model import build_gpt

    hf_config, state = one_rank_moe
    lay = convert.Layout.of(hf_config)
    gpt = build_gpt(hf_config, torch.device("cpu"), convert.padded_vocab(lay.vocab_size, 1))
    ours = {k: tuple(v.shape) for k, v in
            convert.hf_to_megatron_shard(state, lay, convert.Parallel()).items()}
    assert ours == {k: tuple(v.shape) for k, v in gpt.named_parameters()}
    assert type(gpt.decoder.layers[0].mlp.experts).__name__ == "SequentialMLP"
    config = gpt.config
    assert (config.num_moe_experts, config.moe_router_topk, config.moe_ffn_hidden_size) == \
        (4, 2, 192)
    assert not config.moe_router_pre_softmax and config.moe_aux_loss_coeff == pytest.approx(0.001)


@pytest.fixture(scope="module")
def one_rank_moe(tmp_path_factory):
    import torch.distributed as dist

    from miles.backends.megatron.model import destroy_parallel, init_parallel

    if dist.is_initialized():
        pytest.skip("torch.distributed is already initialised in this process")
    store = tmp_path_factory.mktemp("dist") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    init_parallel(0)
    model, _ = build_tiny_moe_model(0)
    try:
        yield model.config, model.state_dict()
    finally:
        destroy_parallel()
        dist.destroy_process_group()


# ---- the flag -----------------------------------------------------------------------------------
def refused(argv: list[str]) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        parse_config(argv)
    assert err.value.flag == EP_FLAG
    return err.value


def test_bad_expert_parallel_sizes_are_refused_by_name(monkeypatch):
    assert parse_config([]).train.expert_model_parallel_size == 1
    refused([EP_FLAG, "0"])
    err = refused(["--actor-num-gpus-per-node", "2", EP_FLAG, "2"])  # FSDP
    assert "--train-backend megatron only" in str(err)
    megatron = ["--train-backend", "megatron", "--actor-num-gpus-per-node", "4"]
    err = refused([*megatron, "--tensor-model-parallel-size", "2", EP_FLAG, "4"])
    assert "the 2 data parallel ranks" in str(err)  # megatron-core's layout: EP within DP
    assert parse_config([*megatron, EP_FLAG, "4"]).train.expert_model_parallel_size == 4

    def checked(shape, ep: int, ranks: int):
        monkeypatch.setattr(preflight, "_model_shape", lambda config: shape)
        train = TrainConfig(train_backend="megatron", actor_num_gpus_per_node=ranks,
                            expert_model_parallel_size=ep)
        preflight.check_parallel_layout(MilesConfig(train=train))

    checked(tiny_moe_shape(), 2, 2)  # 4 experts over 2 ranks
    with pytest.raises(ConfigError, match="needs a mixture-of-experts model") as err:
        checked(tiny_shape(), 2, 2)
    assert err.value.flag == EP_FLAG
    with pytest.raises(ConfigError, match="4 experts must divide by the expert parallel size 3"):
        checked(tiny_moe_shape(), 3, 3)
    # megatron-core's MoE layer refuses to train at TP > 1 without sequence parallel
    monkeypatch.setattr(preflight, "_model_shape", lambda config: tiny_moe_shape())
    train = TrainConfig(train_backend="megatron", actor_num_gpus_per_node=2,
                        tensor_model_parallel_size=2)
    with pytest.raises(ConfigError, match="needs --sequence-parallel") as err:
        preflight.check_parallel_layout(MilesConfig(train=train))
    assert err.value.flag == "--sequence-parallel"
    sp = TrainConfig(train_backend="megatron", actor_num_gpus_per_node=2,
                     tensor_model_parallel_size=2, sequence_parallel=True)
    preflight.check_parallel_layout(MilesConfig(train=sp))


# ---- EP = 2 against EP = 1 on gloo ranks --------------------------------------------------------
@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    """An untrained tiny MoE checkpoint as transformers writes it (per-expert files)."""
    from miles.tiny.warmstart import save_checkpoint

    out = tmp_path_factory.mktemp("moe") / "model"
    save_checkpoint(*build_tiny_moe_model(0), out)
    return out


def with_records(samples):
    """The samples with made-up routed-experts records (tokens - 1, 2 MoE layers, top-2), as an
    engine fills them."""
    import numpy as np

    rng = np.random.default_rng(0)
    for s in samples:
        s.routed_experts = rng.integers(0, 4, (len(s.tokens) - 1, 2, 2)).astype(np.int8)
    return samples


def run_layout(model_dir, world: int, ep: int, pp: int = 1, then=None, tp: int = 1):
    """The HF state exported before training, STEPS one-step trainings, the weights after, and
    each rank's result of the first training (its routing counts); `then(group, cfg)` runs on the
    group before it stops. TP > 1 runs with sequence parallel (megatron-core's MoE layer needs
    it), on samples carrying the engine's routed experts, which it leaves alone (no replay
    there)."""
    cfg = config(world, train_backend="megatron", num_steps_per_rollout=1,
                 expert_model_parallel_size=ep, pipeline_model_parallel_size=pp,
                 tensor_model_parallel_size=tp, sequence_parallel=str(tp > 1).lower(), **LOSS)
    group = ActorGroup(cfg, str(model_dir))
    try:
        places = [info.extra["parallel"] for info in group.call("info")]
        assert [p["ep_rank"] for p in places] == [(r // tp) % ep for r in range(world)]
        exported = group.call("export_weights", None)[0]
        summaries, ranks = [], []
        for seed in range(STEPS):
            samples, advantages = rollout_like(seed=seed)
            samples = with_records(samples) if tp > 1 else samples
            batches = split_for_ranks(samples, advantages, cfg.global_batch_size, cfg.world_size,
                                      rollout_id=seed, return_token_stats=True)
            ranks.append(group.train(batches))
            summaries.append(combine(ranks[-1]))
        weights = group.call("export_weights", None)[0]
        if then is not None:
            then(group, cfg)
        return exported, summaries, weights, ranks[0]
    finally:
        group.stop()


@pytest.fixture(scope="module")
def ep1(ray_cluster, moe_model):
    return run_layout(moe_model, 1, 1)


def hf_log_probs(model_dir, samples) -> dict[int, list[float]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    out = {}
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.tokens])
            logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
            per_token = logp.gather(-1, ids[0, 1:, None])[:, 0]
            out[s.index] = per_token[-s.response_length:].tolist()
    return out


def test_ep1_log_probs_equal_hf_and_the_export_is_the_hf_state(ep1, moe_model):
    exported, summaries, _, _ = ep1
    model, _ = build_tiny_moe_model(0)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert exported.keys() == state.keys()
    assert all(torch.equal(exported[k], state[k]) for k in state)
    expected = hf_log_probs(moe_model, rollout_like(seed=0)[0])
    stats = summaries[0].token_stats
    assert stats.keys() == expected.keys()
    for index, log_probs in expected.items():
        assert stats[index]["log_probs"] == pytest.approx(log_probs, rel=0, abs=1e-5), index


def resumes_bit_exact(directory):
    """Save (HF-named weights and optimizer state, every expert gathered), take a step, load, take
    it again: the same weights and the same step, bit for bit."""

    def check(group, cfg):
        group.call("save", str(directory))
        optim = torch.load(directory / "optimizer.pt", weights_only=True)
        assert optim["state"]["model.layers.1.mlp.experts.gate_up_proj"]["exp_avg"].shape[0] == 4
        saved = group.call("weights_digest")
        after_save = one_step(group, cfg)
        group.call("load", str(directory))
        assert group.call("weights_digest") == saved
        assert one_step(group, cfg).metrics == after_save.metrics

    return check


def one_step(group, cfg):
    samples, advantages = rollout_like(seed=STEPS)
    return combine(group.train(split_for_ranks(samples, advantages, cfg.global_batch_size,
                                               cfg.world_size, rollout_id=STEPS)))


@pytest.fixture(scope="module")
def layouts(ray_cluster, moe_model, tmp_path_factory):
    """(ep, pp, tp) -> `run_layout` on 2 ranks, run once when first asked (EP=2's with the resume
    check): the parallel-step test and the routing tests read the same runs."""
    done = {}

    def run(ep: int, pp: int, tp: int):
        if (ep, pp, tp) not in done:
            then = resumes_bit_exact(tmp_path_factory.mktemp("ep-resume")) if ep > 1 else None
            done[(ep, pp, tp)] = run_layout(moe_model, 2, ep, pp, then=then, tp=tp)
        return done[(ep, pp, tp)]

    return run


@pytest.mark.parametrize("ep,pp,tp", [(2, 1, 1), (1, 2, 1), (1, 1, 2)],
                         ids=["ep2", "pp2", "tp2-sequence-parallel"])
def test_ep2_and_pp2_take_the_ep1_steps_and_export_every_expert(ep1, layouts, ep, pp, tp):
    (ref_export, ref, ref_weights, _) = ep1
    exported, got, weights, _ = layouts(ep, pp, tp)
    assert exported.keys() == ref_export.keys()
    assert all(torch.equal(exported[k], ref_export[k]) for k in exported)  # the EP gather
    first, mine = ref[0], got[0]
    assert mine.metrics["train/loss"] == pytest.approx(first.metrics["train/loss"], rel=0, abs=1e-5)
    assert mine.token_stats.keys() == first.token_stats.keys() and len(first.token_stats) == 16
    for index, stats in first.token_stats.items():
        for key in ("log_probs", "entropy"):
            assert mine.token_stats[index][key] == pytest.approx(stats[key], rel=0, abs=1e-5)
    for a, b in zip(ref, got):
        assert b.metrics["train/grad_norm"] == pytest.approx(a.metrics["train/grad_norm"],
                                                             rel=1e-5)
        assert b.metrics["train/param_norm"] == pytest.approx(a.metrics["train/param_norm"],
                                                              rel=1e-6)
    assert max_abs_diff(ref_weights, weights) <= 1e-4  # after STEPS optimizer steps (HF names)
    moved = max_abs_diff(ref_export, weights)
    assert moved > 1e-3  # the steps changed the weights, experts included
    expert = "model.layers.0.mlp.experts.down_proj"
    assert (weights[expert] - ref_export[expert]).abs().amax(dim=(1, 2)).min() > 0


# ---- the routing figures of those training passes -----------------------------------------------
@pytest.fixture(scope="module")
def fsdp(ray_cluster, moe_model):
    """One training call of two FSDP ranks (one optimizer step: its forward sees the base
    weights), on the samples of the layouts' first call."""
    cfg = config(2, num_steps_per_rollout=1)
    samples, advantages = rollout_like()
    group = ActorGroup(cfg, str(moe_model))
    try:
        return group.train(split_for_ranks(samples, advantages, cfg.global_batch_size, 2, 0))
    finally:
        group.stop()


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


def test_megatron_ep2_counts_the_routing_fsdp_counts(fsdp, layouts):
    """EP=2's first training call (the reference model's pass, with the KL loss, counts nothing)."""
    megatron = layouts(2, 1, 1)[3]
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
def test_megatron_pp2_stages_each_count_their_own_layer(fsdp, layouts):
    """PP=2: each stage reports its own layer, by its global index, and the counts are FSDP's.
    (A tensor-parallel peer would route its TP rank 0's tokens again and reports none:
    routes_own_tokens; with sequence parallel no rank counts.)"""
    ranks = layouts(1, 2, 1)[3]
    assert [sorted(r.routing) for r in ranks] == [[0], [1]]
    got, want = merge_ranks([r.routing for r in ranks]), merge_ranks([r.routing for r in fsdp])
    for layer in want:
        assert (got[layer].tokens, got[layer].counts) == (want[layer].tokens, want[layer].counts)
        assert got[layer].prob_sums == pytest.approx(want[layer].prob_sums, rel=1e-4)
