"""HF (Qwen3 and Llama layouts) <-> Megatron-core GPTModel (local layer spec) tensor names and layouts, both ways, exact.

Works on any name -> tensor dict shaped like the weights: the weights themselves, and the
optimizer's per-parameter moments (exp_avg, exp_avg_sq), so checkpoints stay in HF names.
Two groups of HF tensors become fused Megatron tensors:
- q/k/v_proj -> linear_qkv, interleaved per query group: rows [q heads of group g, k_g, v_g] for g in groups;
- gate_proj, up_proj -> linear_fc1, concatenated (Megatron's GLU applies silu to the first half).
Everything else is a rename; Qwen3 has per-head q/k RMSNorms that Llama has not (`Layout.qk_norm`).
With tied embeddings Megatron has no output_layer; the HF side
gets `lm_head.weight` = the embedding (as HF's own `state_dict()` does).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

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

    @classmethod
    def of(cls, hf_config) -> "Layout":
        heads = hf_config.num_attention_heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
        return cls(hf_config.num_hidden_layers, heads, hf_config.num_key_value_heads, head_dim,
                   bool(getattr(hf_config, "tie_word_embeddings", False)), qk_norm(hf_config))

    def renames(self) -> dict[str, str]:
        """The per-layer renames this layout has (no q/k norms without qk_norm)."""
        return {m: h for m, h in LAYER_RENAMES.items() if self.qk_norm or m not in QK_NORMS}


QK_NORMS = ("self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight")
# model_type -> whether attention normalises q and k per head; the architectures the conversion covers.
QK_NORM_BY_MODEL = {"qwen3": True, "llama": False}


def qk_norm(hf_config) -> bool:
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in QK_NORM_BY_MODEL:
        raise ValueError(f"--train-backend megatron converts {' and '.join(sorted(QK_NORM_BY_MODEL))} checkpoints; "
                         f"this one is {model_type!r}")
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


def hf_to_megatron(hf: dict[str, torch.Tensor], lay: Layout) -> dict[str, torch.Tensor]:
    """Megatron parameter name -> tensor; raises KeyError naming an HF tensor that is missing."""
    out = {EMBED[0]: hf[EMBED[1]], FINAL_NORM[0]: hf[FINAL_NORM[1]]}
    if not lay.tied:
        out[OUTPUT[0]] = hf[OUTPUT[1]]
    for i in range(lay.num_layers):
        m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        for m_name, h_name in lay.renames().items():
            out[m + m_name] = hf[h + h_name]
        out[m + QKV] = _fuse_qkv(*(hf[h + part] for part in QKV_PARTS), lay)
        out[m + FC1] = torch.cat([hf[h + part] for part in FC1_PARTS], dim=0)
    return out


def megatron_to_hf(mg: dict[str, torch.Tensor], lay: Layout) -> dict[str, torch.Tensor]:
    """HF name -> tensor, the key set of the HF model's `state_dict()` (lm_head included when tied)."""
    out = {EMBED[1]: mg[EMBED[0]], FINAL_NORM[1]: mg[FINAL_NORM[0]]}
    out[OUTPUT[1]] = mg[EMBED[0]] if lay.tied else mg[OUTPUT[0]]
    for i in range(lay.num_layers):
        m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        for m_name, h_name in lay.renames().items():
            out[h + h_name] = mg[m + m_name]
        for part, tensor in zip(QKV_PARTS, _split_qkv(mg[m + QKV], lay)):
            out[h + part] = tensor
        for part, tensor in zip(FC1_PARTS, mg[m + FC1].chunk(2, dim=0)):
            out[h + part] = tensor
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
    for m_name, h_name in lay.renames().items():
        if local == h_name:
            return m + m_name
    raise KeyError(f"no Megatron parameter for HF tensor {hf_name!r}")
