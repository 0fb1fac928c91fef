"""HF <-> Megatron conversion for tensor x pipeline parallel ranks (`convert.hf_to_megatron_shard`,
`convert.megatron_shards_to_hf`): exact round trips for TP 1-3 and PP 1-2 (Qwen3 and Llama layouts,
tied and untied), and every rank's names and shapes equal those of the megatron-core GPTModel stage
built for it. Pure tensors: the stage models are built in this process, over stand-in TP/PP groups
(construction needs only their size and rank; nothing is communicated)."""
import dataclasses
import itertools

import pytest
import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from miles.backends.megatron import convert, gather

VOCAB = 100  # not a multiple of 128: every layout pads the vocab
SHAPE = dict(hidden_size=24, intermediate_size=36, num_hidden_layers=4, num_attention_heads=12,
             num_key_value_heads=6, head_dim=4, max_position_embeddings=64)
LAYOUTS = list(itertools.product((1, 2, 3), (1, 2)))


def hf_model(qk_norm: bool, tied: bool, vocab: int = VOCAB):
    torch.manual_seed(0)
    make, config = (Qwen3ForCausalLM, Qwen3Config) if qk_norm else (LlamaForCausalLM, LlamaConfig)
    return make(config(vocab_size=vocab, tie_word_embeddings=tied, **SHAPE))


def shard_all(hf: dict, lay: convert.Layout, tp: int, pp: int) -> dict:
    return {(t, p): convert.hf_to_megatron_shard(hf, lay, convert.Parallel(tp, t, pp, p))
            for t in range(tp) for p in range(pp)}


@pytest.mark.parametrize("qk_norm,tied", list(itertools.product((True, False), (True, False))))
@pytest.mark.parametrize("tp,pp", LAYOUTS)
def test_round_trip_is_exact(tp, pp, qk_norm, tied):
    model = hf_model(qk_norm, tied)
    lay, state = convert.Layout.of(model.config), model.state_dict()
    shards = shard_all(state, lay, tp, pp)
    back = convert.megatron_shards_to_hf(shards, lay, tp, pp)
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], state[k]) for k in state)
    # the optimizer's moments: HF names without the tied lm_head (HF's parameters() lists it once)
    moments = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    back = convert.megatron_shards_to_hf(shard_all(moments, lay, tp, pp), lay, tp, pp)
    assert all(torch.equal(back[k], moments[k]) for k in moments)
    # a broadcast push: each stage's part (its TP shards gathered) holds only that stage's
    # tensors, and the parts together are the model once (a tied head goes with neither)
    parts = [gather.stage_hf([shards[(t, p)] for t in range(tp)], lay,
                             convert.Parallel(tp, 0, pp, p)) for p in range(pp)]
    assert sum(len(part) for part in parts) == len({k for part in parts for k in part})
    head = {"lm_head.weight"} if tied else set()
    assert {k for part in parts for k in part} == state.keys() - head
    assert all(torch.equal(part[k], state[k]) for part in parts for k in part)
    for p, part in enumerate(parts):
        layers = {int(k.split(".")[2]) for k in part if k.startswith("model.layers.")}
        assert layers == set(convert.stage_layers(lay.num_layers, pp, p))


def test_each_rank_holds_its_slice_of_the_whole_layout():
    """Not only invertible: the slices are Megatron's (whole query groups, [gate; up] per rank,
    vocab rows padded with zeros), so a TP=1, PP=1 shard is the whole conversion plus the pad."""
    model = hf_model(True, False)
    lay, state = convert.Layout.of(model.config), model.state_dict()
    whole = convert.hf_to_megatron(state, lay)
    single = convert.hf_to_megatron_shard(state, lay, convert.Parallel())
    assert single.keys() == whole.keys()
    for name in whole:
        rows = whole[name].shape[0]
        assert torch.equal(single[name][:rows], whole[name]), name
        assert not single[name][rows:].any(), name  # only the vocab pad differs
    assert single[convert.EMBED[0]].shape[0] == convert.padded_vocab(VOCAB, 1) == 128
    rank1 = convert.hf_to_megatron_shard(state, lay, convert.Parallel(tp_size=3, tp_rank=1))
    qkv, fc1 = (f"decoder.layers.0.{n}" for n in (convert.QKV, convert.FC1))
    group_rows = (12 // 6 + 2) * 4  # (q heads per group + k + v) x head_dim
    assert torch.equal(rank1[qkv], whole[qkv][2 * group_rows:4 * group_rows])  # groups 2 and 3 of 6
    gate, up = whole[fc1].chunk(2)
    assert torch.equal(rank1[fc1], torch.cat([gate[12:24], up[12:24]]))
    proj = "decoder.layers.0.self_attention.linear_proj.weight"
    assert torch.equal(rank1[proj], whole[proj][:, 16:32])
    # vocab 100 padded to 384: rank 0 holds rows 0-99 and 28 pad rows, rank 1 only pad
    rank0 = convert.hf_to_megatron_shard(state, lay, convert.Parallel(tp_size=3, tp_rank=0))
    padded = torch.cat([whole[convert.EMBED[0]], torch.zeros(28, 24)])
    assert torch.equal(rank0[convert.EMBED[0]], padded)
    assert rank1[convert.EMBED[0]].shape == (128, 24) and not rank1[convert.EMBED[0]].any()


def test_vocab_already_a_multiple_is_not_padded_and_equals_the_whole_conversion():
    model = hf_model(True, True, vocab=256)
    lay, state = convert.Layout.of(model.config), model.state_dict()
    whole = convert.hf_to_megatron(state, lay)
    single = convert.hf_to_megatron_shard(state, lay, convert.Parallel())
    assert single.keys() == whole.keys() and all(torch.equal(single[k], whole[k]) for k in whole)


def test_pipeline_stages_renumber_layers_and_hold_ends():
    model = hf_model(True, True)
    lay, state = convert.Layout.of(model.config), model.state_dict()
    first, last = (convert.hf_to_megatron_shard(state, lay, convert.Parallel(pp_size=2, pp_rank=r))
                   for r in (0, 1))
    assert convert.EMBED[0] in first
    assert convert.OUTPUT[0] not in first and convert.FINAL_NORM[0] not in first
    assert convert.EMBED[0] not in last and convert.FINAL_NORM[0] in last
    # tied with PP>1: the last stage holds its own copy of the embedding as the output layer
    assert torch.equal(last[convert.OUTPUT[0]], first[convert.EMBED[0]])
    norm = "input_layernorm.weight"
    assert torch.equal(last[f"decoder.layers.0.{norm}"], state[f"model.layers.2.{norm}"])
    assert not any(k.startswith("decoder.layers.2.") for k in last)


@pytest.mark.parametrize("vocab,tp,padded", [
    (100, 1, 128), (100, 3, 384), (128, 1, 128), (129, 2, 256),
    (151936, 1, 151936), (151936, 2, 152064), (49152, 3, 49152)])
def test_padded_vocab_is_megatrons_rule(vocab, tp, padded):
    assert convert.padded_vocab(vocab, tp) == padded


def test_layouts_that_do_not_divide_are_refused_by_name():
    model = hf_model(True, True)
    lay, state = convert.Layout.of(model.config), model.state_dict()
    with pytest.raises(ValueError, match=r"attention heads \(12\) must divide by the tensor"):
        convert.hf_to_megatron_shard(state, lay, convert.Parallel(tp_size=5))
    with pytest.raises(ValueError, match="4 layers do not split evenly over 3 pipeline stages"):
        convert.hf_to_megatron_shard(state, lay, convert.Parallel(pp_size=3))
    with pytest.raises(ValueError, match="tp_rank 2 is outside a tp group of size 2"):
        convert.Parallel(tp_size=2, tp_rank=2)
    assert convert.stage_layers(30, 2, 1) == range(15, 30)


class StandIn:
    """A process group as megatron-core's layer constructors see it: a size and this rank."""

    def __init__(self, size: int, rank: int):
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


@pytest.fixture(scope="module")
def one_process_world(tmp_path_factory):
    """Megatron's layers read group sizes only once torch.distributed is up: a world of one."""
    if dist.is_initialized():
        pytest.skip("torch.distributed is already initialised in this process")
    store = tmp_path_factory.mktemp("dist") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def stage_model(hf_config, tp: int, pp: int, par: convert.Parallel):
    from megatron.core.process_groups_config import ProcessGroupCollection

    from miles.backends.megatron import model

    groups = ProcessGroupCollection()
    groups.tp, groups.pp = StandIn(tp, par.tp_rank), StandIn(pp, par.pp_rank)
    groups.cp = StandIn(1, 0)
    groups.embd = None  # no first/last stage all-reduce of the tied embedding at construction
    config = dataclasses.replace(model.transformer_config(hf_config), tensor_model_parallel_size=tp,
                                 pipeline_model_parallel_size=pp, pipeline_dtype=torch.float32)
    _, GPTModel, local_spec, _ = model._megatron()
    spec = local_spec(qk_layernorm=config.qk_layernorm, normalization="RMSNorm")
    return GPTModel(config=config, transformer_layer_spec=spec,
                    vocab_size=convert.padded_vocab(hf_config.vocab_size, tp),
                    max_sequence_length=hf_config.max_position_embeddings,
                    position_embedding_type="rope",
                    share_embeddings_and_output_weights=hf_config.tie_word_embeddings,
                    pre_process=par.first_stage, post_process=par.last_stage, pg_collection=groups)


@pytest.mark.parametrize("qk_norm,tied", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("tp,pp", LAYOUTS)
def test_shard_shapes_equal_megatron_cores_stage_model(one_process_world, tp, pp, qk_norm, tied):
    model = hf_model(qk_norm, tied)
    lay, state = convert.Layout.of(model.config), model.state_dict()
    for par in (convert.Parallel(tp, t, pp, p) for t in range(tp) for p in range(pp)):
        ours = {k: tuple(v.shape) for k, v in convert.hf_to_megatron_shard(state, lay, par).items()}
        stage = stage_model(model.config, tp, pp, par)
        real = {k: tuple(v.shape) for k, v in stage.named_parameters()}
        assert ours == real, par
