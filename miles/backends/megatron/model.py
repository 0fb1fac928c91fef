"""Megatron-core's GPTModel with Qwen3 semantics, built from an HF config; parallel state set-up and teardown.

Local (torch) layer spec, so neither Transformer Engine nor Apex is needed: RMSNorm everywhere
(including per-head q/k norms), SwiGLU MLP, no biases, RoPE, grouped-query attention, fp32,
no dropout. Tensor and pipeline parallel size 1: the whole world is data parallel.
"""
from __future__ import annotations

import contextlib
import warnings

import torch
import torch.nn.functional as F

from miles.backends.megatron import shim
from miles.backends.megatron.convert import qk_norm


@contextlib.contextmanager
def _quiet():
    """Without megatron-core's warnings that TE/Apex are absent: the local (torch) spec is chosen on purpose."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(Transformer Engine and Apex|Apex) (are|is) not installed")
        yield


def _megatron():
    """megatron-core's modules, imported late: only a Megatron rank needs them."""
    with _quiet():
        from megatron.core import parallel_state
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.transformer_config import TransformerConfig
    return parallel_state, GPTModel, get_gpt_layer_local_spec, TransformerConfig


def rope_theta(hf_config) -> float:
    """transformers >= 5 keeps it in `rope_parameters`, older versions as `rope_theta`."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    if params.get("rope_type", "default") != "default":
        raise ValueError(f"--train-backend megatron: rope scaling {params['rope_type']!r} is not supported")
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None))
    if theta is None:
        raise ValueError("--train-backend megatron: the HF config has no rope_theta")
    return float(theta)


def check_supported(hf_config) -> None:
    """The conversion and the config below cover Qwen3- and Llama-style dense models; say what else is not."""
    qk_norm(hf_config)  # raises for other architectures
    problems = []
    if getattr(hf_config, "attention_bias", False):
        problems.append("attention_bias=True")
    if getattr(hf_config, "mlp_bias", False):
        problems.append("mlp_bias=True")
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={hf_config.hidden_act!r}")
    if getattr(hf_config, "use_sliding_window", False):
        problems.append("use_sliding_window=True")
    if getattr(hf_config, "num_experts", 0):
        problems.append("mixture of experts")
    if problems:
        raise ValueError(f"--train-backend megatron supports Qwen3- and Llama-style dense models; this checkpoint "
                         f"({hf_config.model_type}) has {', '.join(problems)}")


def transformer_config(hf_config):
    check_supported(hf_config)
    _, _, _, TransformerConfig = _megatron()
    heads = hf_config.num_attention_heads
    return TransformerConfig(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=heads,
        num_query_groups=hf_config.num_key_value_heads,
        kv_channels=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        qk_layernorm=qk_norm(hf_config),
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=torch.float32,
        use_cpu_initialization=shim.needed(),
        perform_initialization=False,  # every weight is loaded from the HF checkpoint next
        cuda_graph_scope=[],  # the default ("full") is deprecated and warns; [] means the same
    )


def build_gpt(hf_config, device: torch.device):
    """An uninitialised GPTModel on `device` (weights come from `convert.hf_to_megatron`)."""
    _, GPTModel, local_spec, _ = _megatron()
    config = transformer_config(hf_config)
    with _quiet():
        spec = local_spec(qk_layernorm=qk_norm(hf_config), normalization="RMSNorm")
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=hf_config.vocab_size,
        max_sequence_length=hf_config.max_position_embeddings,
        position_embedding_type="rope",
        rotary_base=rope_theta(hf_config),
        share_embeddings_and_output_weights=bool(getattr(hf_config, "tie_word_embeddings", False)),
    )
    return model.to(device)


def init_parallel(seed: int) -> None:
    """TP = PP = 1 over the default process group (gloo on CPU, NCCL on GPU), seeded RNG tracker."""
    parallel_state = _megatron()[0]
    shim.install()
    # No extra gloo groups: gradients are all-reduced on the default group by the actor.
    parallel_state.initialize_model_parallel(1, 1, create_gloo_process_groups=False)
    shim.seed_model_parallel_rng(seed)


def destroy_parallel() -> None:
    parallel_state = _megatron()[0]
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
