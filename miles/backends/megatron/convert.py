"""HF (Qwen3 and Llama layouts) <-> Megatron-core GPTModel (local layer spec) tensor names and layouts, both ways, exact.

The whole model (`hf_to_megatron`), or one tensor x pipeline parallel rank's shard
(`hf_to_megatron_shard`, `megatron_shards_to_hf`).

Works on any name -> tensor dict shaped like the weights: the weights themselves, and the
optimizer's per-parameter moments (exp_avg, exp_avg_sq), so checkpoints stay in HF names.
Two groups of HF tensors become fused Megatron tensors:
- q/k/v_proj -> linear_qkv, interleaved per query group: rows [q heads of group g, k_g, v_g] for g in groups;
- gate_proj, up_proj -> linear_fc1, concatenated (Megatron's GLU applies silu to the first half).
Everything else is a rename; Qwen3 has per-head q/k RMSNorms that Llama has not (`Layout.qk_norm`).
Qwen3-MoE (`Layout.num_experts` > 0): every layer's MLP is a router and E experts. transformers
keeps the experts fused in memory (`mlp.experts.gate_up_proj` [E, 2I, H], gate rows first;
`mlp.experts.down_proj` [E, H, I]); Megatron has one local MLP per expert
(`mlp.experts.local_experts.{e}.linear_fc1.weight` = that expert's [gate; up], `linear_fc2.weight`)
and the router as `mlp.router.weight` (HF `mlp.gate.weight`). Under expert parallelism a rank
holds a contiguous slice of the experts, numbered from 0 (`Parallel.ep_rank`).
With tied embeddings Megatron has no output_layer; the HF side
gets `lm_head.weight` = the embedding (as HF's own `state_dict()` does).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from miles.moe import expert_files

EMBED = ("embedding.word_embeddings.weight", "model.embed_tokens.weight")
FINAL_NORM = ("decoder.final_layernorm.weight", "model.norm.weight")
OUTPUT = ("output_layer.weight", "lm_head.weight")
QKV = "self_attention.linear_qkv.weight"
FC1 = "mlp.linear_fc1.weight"
QKV_PARTS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
FC1_PARTS = ("mlp.gate_proj.weight", "mlp.up_proj.weight")
# Per layer, Megatron local-spec name -> HF name. These are the local spec's parameter names
# (separate input_layernorm / pre_mlp_layernorm, not TE's fused linear_qkv.layer_norm_weight);
# its `state_dict()` adds only `*._extra_state` entries (None), which carry no weights.
LAYER_RENAMES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}


@dataclass(frozen=True)
class Layout:
    """The shapes the conversion needs, from the HF config."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tied: bool
    qk_norm: bool = True
    vocab_size: int | None = None  # HF embedding rows: the sharded conversion pads and strips to it
    num_experts: int = 0  # routed experts per layer (every layer's MLP); 0: dense MLPs

    @classmethod
    def of(cls, hf_config) -> "Layout":
        heads = hf_config.num_attention_heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
        return cls(hf_config.num_hidden_layers, heads, hf_config.num_key_value_heads, head_dim,
                   bool(getattr(hf_config, "tie_word_embeddings", False)), qk_norm(hf_config),
                   hf_config.vocab_size, int(getattr(hf_config, "num_experts", 0) or 0))

    def renames(self) -> dict[str, str]:
        """The per-layer renames this layout has (no q/k norms without qk_norm; no dense fc2 with
        experts)."""
        return {m: h for m, h in LAYER_RENAMES.items()
                if (self.qk_norm or m not in QK_NORMS)
                and not (self.num_experts and m == DENSE_FC2)}

    def hf_layer_names(self) -> list[str]:
        """One layer's HF parameter names (without `model.layers.N.`), in conversion order."""
        mlp = MOE_HF if self.num_experts else FC1_PARTS
        return [*self.renames().values(), *QKV_PARTS, *mlp]


QK_NORMS = ("self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight")
DENSE_FC2 = "mlp.linear_fc2.weight"
# MoE layers: the router and the fused experts (HF, in memory) <-> Megatron's per-expert MLPs.
ROUTER = ("mlp.router.weight", "mlp.gate.weight")
GATE_UP, DOWN = "mlp.experts.gate_up_proj", "mlp.experts.down_proj"
MOE_HF = (ROUTER[1], GATE_UP, DOWN)
LOCAL_EXPERT = "mlp.experts.local_experts."
_EXPERT_NAME = re.compile(r"(.*mlp\.experts\.local_experts\.)(\d+)(\..*)")


def is_expert(name: str) -> bool:
    """A parameter of one expert (split over EP ranks), by its Megatron name."""
    return LOCAL_EXPERT in name


def fused_source(name: str) -> str:
    """The Megatron parameter (whole-model name) whose per-parameter scalars (Adam's step) the HF
    tensor holding `name` keeps: itself, or for an expert expert 0's (`megatron_source`)."""
    match = _EXPERT_NAME.fullmatch(name)
    return name if match is None else f"{match[1]}0{match[3]}"


def expert_fc1(e: int) -> str:
    return f"{LOCAL_EXPERT}{e}.linear_fc1.weight"


def expert_fc2(e: int) -> str:
    return f"{LOCAL_EXPERT}{e}.linear_fc2.weight"
# model_type -> whether attention normalises q and k per head; the architectures the conversion covers.
QK_NORM_BY_MODEL = {"qwen3": True, "qwen3_moe": True, "llama": False}


def qk_norm(hf_config) -> bool:
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in QK_NORM_BY_MODEL:
        *others, last = sorted(QK_NORM_BY_MODEL)
        raise ValueError(f"--train-backend megatron converts {', '.join(others)} and {last} "
                         f"checkpoints; this one is {model_type!r}")
    return QK_NORM_BY_MODEL[model_type]


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lay: Layout) -> torch.Tensor:
    groups, d = lay.num_kv_heads, lay.head_dim
    per_group = lay.num_heads // groups
    rest = q.shape[1:]  # (hidden,) for weights and their moments
    fused = torch.cat([q.reshape(groups, per_group * d, *rest), k.reshape(groups, d, *rest),
                       v.reshape(groups, d, *rest)], dim=1)  # (groups, (per_group + 2) * d, hidden)
    return fused.reshape(groups * (per_group + 2) * d, *rest)


def _split_qkv(qkv: torch.Tensor, lay: Layout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups, d = lay.num_kv_heads, lay.head_dim
    per_group = lay.num_heads // groups
    rest = qkv.shape[1:]
    q, k, v = qkv.reshape(groups, (per_group + 2) * d, *rest).split([per_group * d, d, d], dim=1)
    return (q.reshape(lay.num_heads * d, *rest), k.reshape(groups * d, *rest), v.reshape(groups * d, *rest))


def _layer_to_megatron(hf: dict[str, torch.Tensor], lay: Layout,
                       index: int) -> dict[str, torch.Tensor]:
    """HF layer `index` as Megatron per-layer names (without the `decoder.layers.N.` prefix)."""
    h = f"model.layers.{index}."
    out = {m_name: hf[h + h_name] for m_name, h_name in lay.renames().items()}
    out[QKV] = _fuse_qkv(*(hf[h + part] for part in QKV_PARTS), lay)
    if not lay.num_experts:
        out[FC1] = torch.cat([hf[h + part] for part in FC1_PARTS], dim=0)
        return out
    out[ROUTER[0]] = hf[h + ROUTER[1]]
    gate_up, down = hf[h + GATE_UP], hf[h + DOWN]
    for e in range(lay.num_experts):
        out[expert_fc1(e)], out[expert_fc2(e)] = gate_up[e], down[e]
    return out


def _layer_to_hf(mg: dict[str, torch.Tensor], lay: Layout, index: int) -> dict[str, torch.Tensor]:
    """The inverse of `_layer_to_megatron`: HF names of layer `index`, whole (unsharded) tensors."""
    h = f"model.layers.{index}."
    out = {h + h_name: mg[m_name] for m_name, h_name in lay.renames().items()}
    for part, tensor in zip(QKV_PARTS, _split_qkv(mg[QKV], lay)):
        out[h + part] = tensor
    if not lay.num_experts:
        for part, tensor in zip(FC1_PARTS, mg[FC1].chunk(2, dim=0)):
            out[h + part] = tensor
        return out
    experts = range(lay.num_experts)
    out[h + ROUTER[1]] = mg[ROUTER[0]]
    out[h + GATE_UP] = torch.stack([mg[expert_fc1(e)] for e in experts])
    out[h + DOWN] = torch.stack([mg[expert_fc2(e)] for e in experts])
    return out


def fuse_expert_files(hf: dict[str, torch.Tensor], lay: Layout) -> dict[str, torch.Tensor]:
    """A checkpoint as `save_pretrained` writes a Qwen3-MoE (one tensor per expert and projection)
    in the fused in-memory names the conversion reads (miles/moe/expert_files.py); a checkpoint
    already fused is returned as it is."""
    return expert_files.fuse_experts(hf) if lay.num_experts else hf


def hf_to_megatron(hf: dict[str, torch.Tensor], lay: Layout) -> dict[str, torch.Tensor]:
    """Megatron parameter name -> tensor; raises KeyError naming an HF tensor that is missing."""
    out = {EMBED[0]: hf[EMBED[1]], FINAL_NORM[0]: hf[FINAL_NORM[1]]}
    if not lay.tied:
        out[OUTPUT[0]] = hf[OUTPUT[1]]
    for i in range(lay.num_layers):
        layer = _layer_to_megatron(hf, lay, i)
        out.update({f"decoder.layers.{i}.{k}": v for k, v in layer.items()})
    return out


def megatron_to_hf(mg: dict[str, torch.Tensor], lay: Layout) -> dict[str, torch.Tensor]:
    """HF name -> tensor, the key set of the HF model's `state_dict()` (lm_head included when tied)."""
    out = {EMBED[1]: mg[EMBED[0]], FINAL_NORM[1]: mg[FINAL_NORM[0]]}
    out[OUTPUT[1]] = mg[EMBED[0]] if lay.tied else mg[OUTPUT[0]]
    for i in range(lay.num_layers):
        m = f"decoder.layers.{i}."
        out.update(_layer_to_hf({k[len(m):]: v for k, v in mg.items() if k.startswith(m)}, lay, i))
    return out


def megatron_source(hf_name: str, lay: Layout) -> str:
    """The Megatron parameter an HF tensor comes from (for per-parameter scalars such as Adam's step)."""
    for m_name, h_name in (EMBED, FINAL_NORM, OUTPUT):
        if hf_name == h_name:
            return EMBED[0] if lay.tied and hf_name == OUTPUT[1] else m_name
    _, _, rest = hf_name.partition(".layers.")
    index, _, local = rest.partition(".")
    m = f"decoder.layers.{index}."
    if local in QKV_PARTS:
        return m + QKV
    if local in FC1_PARTS:
        return m + FC1
    if lay.num_experts and local in MOE_HF:  # the fused experts: expert 0's (all step together)
        return m + {ROUTER[1]: ROUTER[0], GATE_UP: expert_fc1(0), DOWN: expert_fc2(0)}[local]
    for m_name, h_name in lay.renames().items():
        if local == h_name:
            return m + m_name
    raise KeyError(f"no Megatron parameter for HF tensor {hf_name!r}")


# --- Tensor and pipeline parallel shards ---------------------------------------------------------
# Megatron-LM pads the vocab to a multiple of --make-vocab-size-divisible-by (default 128) times TP,
# so every TP rank holds the same number of embedding / output rows; the pad rows are zeros here.
VOCAB_DIVISIBLE_BY = 128
# Per-layer tensors split over TP along the input dim (RowParallelLinear); the rest of the layer's
# matrices are column-parallel (dim 0) and its norms (RMSNorm weights, q/k norms) replicated.
ROW_PARALLEL = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")
COLUMN_PARALLEL = (QKV, FC1)


@dataclass(frozen=True)
class Parallel:
    """One training rank's place in the tensor x pipeline x expert parallel grid (data parallel
    does not matter here: every DP replica holds the same shards; expert parallel ranks are carved
    out of the DP ones and hold the same dense tensors, each its slice of the experts)."""

    tp_size: int = 1
    tp_rank: int = 0
    pp_size: int = 1
    pp_rank: int = 0
    ep_size: int = 1
    ep_rank: int = 0

    def __post_init__(self):
        groups = ((self.tp_size, self.tp_rank, "tp"), (self.pp_size, self.pp_rank, "pp"),
                  (self.ep_size, self.ep_rank, "ep"))
        for size, rank, what in groups:
            if size < 1 or not 0 <= rank < size:
                raise ValueError(f"{what}_rank {rank} is outside a {what} group of size {size}")

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1


def stage_layers(num_layers: int, pp_size: int, pp_rank: int) -> range:
    """Global indices of the layers pipeline stage `pp_rank` builds: megatron-core's even split
    (no uneven first/last stage, no virtual stages), `num_layers / pp_size` consecutive layers."""
    if num_layers % pp_size:
        raise ValueError(f"{num_layers} layers do not split evenly over {pp_size} pipeline stages")
    per_stage = num_layers // pp_size
    return range(pp_rank * per_stage, (pp_rank + 1) * per_stage)


def padded_vocab(vocab_size: int, tp_size: int, divisible_by: int = VOCAB_DIVISIBLE_BY) -> int:
    """The vocab Megatron builds: the smallest multiple of `divisible_by * tp_size` >= `vocab_size`
    (padded at TP=1 too, as Megatron-LM does). The pad rows are zeros, so their logits are 0, not
    HF's: log-probs and entropy must mask the columns >= `vocab_size` to equal HF's."""
    multiple = divisible_by * tp_size
    return -(-vocab_size // multiple) * multiple


def _divide(n: int, tp_size: int, what: str) -> None:
    if n % tp_size:
        raise ValueError(f"{what} ({n}) must divide by the tensor parallel size {tp_size}")


def _vocab_shard(full: torch.Tensor, lay: Layout, par: Parallel) -> torch.Tensor:
    vocab = _vocab_of(lay, full)
    pad = padded_vocab(vocab, par.tp_size) - vocab
    padded = torch.cat([full, full.new_zeros(pad, *full.shape[1:])]) if pad else full
    return padded.chunk(par.tp_size, dim=0)[par.tp_rank]


def _vocab_of(lay: Layout, full: torch.Tensor | None) -> int:
    if lay.vocab_size is None:
        raise ValueError("Layout.vocab_size is needed to pad and strip the vocab "
                         "(Layout.of sets it)")
    if full is not None and full.shape[0] != lay.vocab_size:
        raise ValueError(f"embedding has {full.shape[0]} rows, the layout says vocab "
                         f"{lay.vocab_size}")
    return lay.vocab_size


def _is_fc1(name: str) -> bool:
    """A [gate; up] tensor: the dense MLP's, or an expert's (expert TP splits it alike)."""
    return name == FC1 or (name.startswith(LOCAL_EXPERT) and name.endswith(".linear_fc1.weight"))


def _is_row_parallel(name: str) -> bool:
    return name in ROW_PARALLEL or (name.startswith(LOCAL_EXPERT)
                                    and name.endswith(".linear_fc2.weight"))


def _tp_shard(name: str, full: torch.Tensor, par: Parallel) -> torch.Tensor:
    """This TP rank's slice of one per-layer tensor (Megatron per-layer name, fused layout). The
    experts are split over TP as the dense MLP (megatron's expert TP size is TP); the router is
    replicated."""
    tp, r = par.tp_size, par.tp_rank
    if _is_fc1(name):  # [gate; up]: each half split on its own, the rank's halves concatenated
        return torch.cat([half.chunk(tp, dim=0)[r] for half in full.chunk(2, dim=0)])
    if name == QKV:  # rows are whole query groups, so a row chunk is a chunk of groups
        return full.chunk(tp, dim=0)[r]
    if _is_row_parallel(name):
        return full.chunk(tp, dim=1)[r].contiguous()
    return full


def _tp_gather(name: str, parts: list[torch.Tensor]) -> torch.Tensor:
    """The inverse of `_tp_shard`: the whole tensor from every TP rank's slice (rank order)."""
    if _is_fc1(name):
        halves = [p.chunk(2, dim=0) for p in parts]
        return torch.cat([torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])])
    if name == QKV:
        return torch.cat(parts, dim=0)
    if _is_row_parallel(name):
        return torch.cat(parts, dim=1)
    return parts[0]


# --- Expert parallel: each EP rank holds a contiguous slice of every layer's experts ------------
def local_experts(lay: Layout, ep_size: int) -> int:
    """Experts per EP rank (megatron-core's even split); raises ValueError when it is not even."""
    if lay.num_experts % ep_size:
        raise ValueError(f"{lay.num_experts} experts do not split evenly over {ep_size} expert "
                         "parallel ranks")
    return lay.num_experts // ep_size


def renumber_experts(tensors: dict[str, torch.Tensor], offset: int,
                     keep: range | None = None) -> dict[str, torch.Tensor]:
    """Expert names shifted by `offset` (local -> global: + first expert; global -> local: -),
    keeping only experts whose (old) index is in `keep` when given; other names unchanged."""
    out = {}
    for name, tensor in tensors.items():
        match = _EXPERT_NAME.fullmatch(name)
        if match is None:
            out[name] = tensor
        elif keep is None or int(match[2]) in keep:
            out[f"{match[1]}{int(match[2]) + offset}{match[3]}"] = tensor
    return out


def expert_range(lay: Layout, par: Parallel) -> range:
    """Global indices of the experts this rank holds."""
    per_rank = local_experts(lay, par.ep_size)
    return range(par.ep_rank * per_rank, (par.ep_rank + 1) * per_rank)


def merge_expert_shards(parts: list[dict[str, torch.Tensor]],
                        lay: Layout) -> dict[str, torch.Tensor]:
    """The EP ranks' dicts (rank order, local expert names) as one with every expert, numbered
    globally; the dense tensors (the same on every EP rank) from the first."""
    per_rank = local_experts(lay, len(parts))
    merged = renumber_experts(parts[0], 0)
    for rank, part in enumerate(parts[1:], start=1):
        merged.update({n: t for n, t in renumber_experts(part, rank * per_rank).items()
                       if _EXPERT_NAME.fullmatch(n)})
    return merged


def check_tp_divides(lay: Layout, tp_size: int, ffn_size: int | None = None) -> None:
    """What megatron-core's parallel layers split evenly over TP: heads, KV heads (whole query
    groups per rank), the MLP's hidden size; raises ValueError naming the one that does not."""
    _divide(lay.num_heads, tp_size, "attention heads")
    _divide(lay.num_kv_heads, tp_size, "KV heads (query groups)")
    if ffn_size is not None:
        _divide(ffn_size, tp_size, "MLP intermediate size")


def hf_to_megatron_shard(hf: dict[str, torch.Tensor], lay: Layout,
                         par: Parallel) -> dict[str, torch.Tensor]:
    """This rank's tensors under the names its stage's GPTModel has (`named_parameters()`).

    - layers: the stage's `stage_layers`, renumbered from 0 (`decoder.layers.0`: its first);
    - `embedding.word_embeddings.weight` on the first stage only; `decoder.final_layernorm.weight`
      and `output_layer.weight` on the last only. Tied embeddings: with PP=1 there is no output
      layer; with PP>1 the last stage has its own copy of the embedding as `output_layer.weight`
      (GPTModel keeps one and all-reduces it with the first stage's);
    - TP: embedding and output layer padded to `padded_vocab` (zero rows) and split by vocab rows;
      linear_qkv split by whole query groups (rows); linear_fc1 split gate and up separately,
      each rank holding [gate slice; up slice]; linear_proj and linear_fc2 split on dim 1; norms
      replicated;
    - EP: the layers' experts `expert_range` only, numbered from 0 (`local_experts.0`: the rank's
      first); each expert split over TP as the dense MLP; the router whole on every rank.
    Works for any tensors shaped like the weights (the optimizer's moments too).
    """
    check_tp_divides(lay, par.tp_size)
    out = {}
    if par.first_stage:
        out[EMBED[0]] = _vocab_shard(hf[EMBED[1]], lay, par)
    if par.last_stage:
        out[FINAL_NORM[0]] = hf[FINAL_NORM[1]]
        if not lay.tied:
            out[OUTPUT[0]] = _vocab_shard(hf[OUTPUT[1]], lay, par)
        elif par.pp_size > 1:
            out[OUTPUT[0]] = _vocab_shard(hf[EMBED[1]], lay, par)
    mine = expert_range(lay, par)
    for local, index in enumerate(stage_layers(lay.num_layers, par.pp_size, par.pp_rank)):
        layer = renumber_experts(_layer_to_megatron(hf, lay, index), -mine.start, keep=mine)
        for name, full in layer.items():
            out[f"decoder.layers.{local}.{name}"] = _tp_shard(name, full, par)
    return out


def megatron_shards_to_hf(shards: dict[tuple, dict[str, torch.Tensor]], lay: Layout,
                          tp_size: int, pp_size: int, ep_size: int = 1) -> dict[str, torch.Tensor]:
    """The inverse of `hf_to_megatron_shard` over all ranks: `shards[(tp_rank, pp_rank)]` (with
    `ep_size` > 1: `shards[(tp_rank, pp_rank, ep_rank)]`) is one rank's dict. Experts are merged
    over EP (numbered globally), TP slices gathered (fused layouts undone), the vocab pad
    stripped, layers numbered globally; the keys are the HF model's `state_dict()` (tied: lm_head
    = embedding)."""
    _vocab_of(lay, None)
    if ep_size > 1:
        missing = [(t, p, e) for t in range(tp_size) for p in range(pp_size)
                   for e in range(ep_size) if (t, p, e) not in shards]
        if missing:
            raise KeyError(f"no shards for (tp_rank, pp_rank, ep_rank) {missing}")
        shards = {(t, p): merge_expert_shards([shards[(t, p, e)] for e in range(ep_size)], lay)
                  for t in range(tp_size) for p in range(pp_size)}
    missing = [(t, p) for t in range(tp_size) for p in range(pp_size) if (t, p) not in shards]
    if missing:
        raise KeyError(f"no shards for (tp_rank, pp_rank) {missing}")

    def gathered(prefix: str, name: str, pp_rank: int) -> torch.Tensor:
        return _tp_gather(name, [shards[(t, pp_rank)][prefix + name] for t in range(tp_size)])

    def vocab(name: str, pp_rank: int) -> torch.Tensor:
        full = torch.cat([shards[(t, pp_rank)][name] for t in range(tp_size)])
        return full[:lay.vocab_size]

    last = pp_size - 1
    out = {EMBED[1]: vocab(EMBED[0], 0), FINAL_NORM[1]: shards[(0, last)][FINAL_NORM[0]]}
    out[OUTPUT[1]] = out[EMBED[1]] if lay.tied else vocab(OUTPUT[0], last)
    for pp_rank in range(pp_size):
        for local, index in enumerate(stage_layers(lay.num_layers, pp_size, pp_rank)):
            m = f"decoder.layers.{local}."
            names = [k[len(m):] for k in shards[(0, pp_rank)] if k.startswith(m)]
            out.update(_layer_to_hf({n: gathered(m, n, pp_rank) for n in names}, lay, index))
    return out
