"""Megatron-core's GPTModel with Qwen3 semantics, built from an HF config; parallel state set-up and teardown.

Local (torch) layer spec, so neither Transformer Engine nor Apex is needed: RMSNorm everywhere
(including per-head q/k norms), SwiGLU MLP, no biases, RoPE, grouped-query attention, fp32,
no dropout. Tensor and pipeline parallel ranks over megatron-core's own groups: each rank builds
its stage's layers (first stage: the embedding; last: the final norm and the output layer), with
its vocabulary slice of the logits left vocab-parallel (`parallel_output=True`). With
`--sequence-parallel` the activations outside the TP regions are split along the sequence
(`sequence_parallel.py`: its norms, the padding), as megatron-core's MoE layer needs at TP > 1.
"""
from __future__ import annotations

import contextlib
import warnings

import torch
import torch.nn.functional as F

from miles.backends.megatron import sequence_parallel as sp_norms
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
    problems += moe_problems(hf_config)
    if problems:
        raise ValueError(f"--train-backend megatron supports Qwen3- and Llama-style dense models "
                         f"and Qwen3-MoE; this checkpoint ({hf_config.model_type}) has "
                         f"{', '.join(problems)}")


def num_experts(hf_config) -> int:
    """Routed experts per MoE layer (0: a dense model)."""
    return int(getattr(hf_config, "num_experts", 0) or 0)


def moe_problems(hf_config) -> list[str]:
    """What of a Qwen3-MoE config megatron-core's MoE layer, as configured below, does not do."""
    if not num_experts(hf_config):
        return []
    problems = []
    step = getattr(hf_config, "decoder_sparse_step", 1)
    dense = getattr(hf_config, "mlp_only_layers", None) or []
    if step != 1 or dense:
        problems.append(f"dense MLP layers among the MoE ones (decoder_sparse_step={step}, "
                        f"mlp_only_layers={list(dense)})")
    if getattr(hf_config, "shared_expert_intermediate_size", 0):
        problems.append("shared experts")
    if hf_config.num_experts_per_tok == 1 and getattr(hf_config, "norm_topk_prob", False):
        problems.append("top-1 routing with norm_topk_prob=True")
    return problems


def moe_settings(hf_config, ep: int) -> dict:
    """TransformerConfig's MoE fields for a Qwen3-MoE config, routed as HF routes (nothing for a
    dense model). HF: softmax over all E logits, top-k, renormalised over the k (norm_topk_prob).
    Softmax is monotone, so the top-k of the logits are the top-k of the probabilities, and
    renormalised probabilities are the softmax of the k chosen logits: megatron's top-k on the
    logits then softmax over the k (`moe_router_pre_softmax=False`). Without renormalising, HF's
    weights are the full softmax's: `moe_router_pre_softmax=True`."""
    experts = num_experts(hf_config)
    if not experts:
        return {}
    return dict(
        num_moe_experts=experts,
        moe_router_topk=hf_config.num_experts_per_tok,
        moe_ffn_hidden_size=hf_config.moe_intermediate_size,
        moe_router_score_function="softmax",
        moe_router_pre_softmax=not getattr(hf_config, "norm_topk_prob", False),
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=float(getattr(hf_config, "router_aux_loss_coef", 0.0) or 0.0),
        moe_grouped_gemm=False,  # SequentialMLP: one local (torch) MLP per expert
        # each router gets a RouterReplay, inert until R3 sets its action (miles/moe/megatron_replay.py)
        moe_enable_routing_replay=True,
        expert_model_parallel_size=ep,  # tokens dispatched all-to-all (transformer_config)
    )


def transformer_config(hf_config, tp: int = 1, pp: int = 1, ep: int = 1, sp: bool = False):
    check_supported(hf_config)
    if ep > 1 and not num_experts(hf_config):
        raise ValueError(f"--expert-model-parallel-size {ep}: the model has no experts")
    if tp > 1 and num_experts(hf_config) and not sp:  # megatron-core's MoE layer refuses it
        raise ValueError(f"--tensor-model-parallel-size {tp}: a mixture-of-experts model needs "
                         "--sequence-parallel at TP > 1")
    if sp and tp == 1:
        raise ValueError("--sequence-parallel needs --tensor-model-parallel-size > 1")
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
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        sequence_parallel=sp,  # sequences split over TP outside its regions (sequence_parallel.py)
        # what keeps megatron-core off its CUDA-only paths on CPU (shim.py), the same on GPU:
        gradient_accumulation_fusion=False,
        pipeline_dtype=torch.float32,  # the activations sent between stages
        variable_seq_lengths=True,  # RL micro-batches differ in length: stages send shapes first
        # the default dispatcher (allgather) refuses variable lengths, with or without experts
        moe_token_dispatcher_type="alltoall",
        batch_p2p_sync=False,
        enable_autocast=False,
        **moe_settings(hf_config, ep),
    )


def build_gpt(hf_config, device: torch.device, vocab_size: int, sequence_parallel: bool = False):
    """This rank's pipeline stage of an uninitialised GPTModel on `device` (weights come from
    `convert.hf_to_megatron_shard`), its vocabulary padded to `vocab_size` (a multiple of TP)."""
    parallel_state, GPTModel, local_spec, _ = _megatron()
    config = transformer_config(hf_config, parallel_state.get_tensor_model_parallel_world_size(),
                                parallel_state.get_pipeline_model_parallel_world_size(),
                                parallel_state.get_expert_model_parallel_world_size(),
                                sequence_parallel)
    if num_experts(hf_config):
        shim.define_te_gemm_absent()  # the router's matmul without Transformer Engine (shim 7)
    if num_experts(hf_config) or sequence_parallel:
        # megatron-core gathers the dispatcher's token counts and sequence parallel's activations
        # with all_gather_into_tensor (and scatters them with reduce_scatter_tensor), which torch
        # marks deprecated: a FutureWarning in every rank's log that no user can act on
        warnings.filterwarnings("ignore", category=FutureWarning,
                                message=r"`torch.distributed.(all_gather_into|reduce_scatter)"
                                        r"_tensor` is deprecated")
    with _quiet():
        spec = local_spec(num_experts=num_experts(hf_config) or None, moe_grouped_gemm=False,
                          qk_layernorm=qk_norm(hf_config), normalization="RMSNorm")
    if sequence_parallel:  # megatron-core's torch norms refuse it: ours mark their weights
        spec = sp_norms.block_spec(spec, config, parallel_state.get_pipeline_model_parallel_rank())
    with shim.cuda_to_cpu():  # the last stage's tied output layer is copied with `.cuda()` (shim 5)
        model = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=vocab_size,
            max_sequence_length=hf_config.max_position_embeddings,
            position_embedding_type="rope",
            rotary_base=rope_theta(hf_config),
            share_embeddings_and_output_weights=bool(getattr(hf_config, "tie_word_embeddings",
                                                             False)),
            parallel_output=True,
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
        )
    _mark_tensor_parallel(model)
    return model.to(device)


def _mark_tensor_parallel(model) -> None:
    """Megatron's parallel layers set `tensor_model_parallel` on their weights only while
    initialising them, and ours are loaded instead (`perform_initialization=False`): set it here,
    as they would, so norms can tell a TP shard (counted on every TP rank) from a replicated
    weight (counted once)."""
    from megatron.core import tensor_parallel as tpl

    split_dim = {tpl.ColumnParallelLinear: 0, tpl.VocabParallelEmbedding: 0,
                 tpl.RowParallelLinear: 1}
    for module in model.modules():
        dim = next((d for cls, d in split_dim.items() if isinstance(module, cls)), None)
        weight = getattr(module, "weight", None)
        if dim is not None and weight is not None and not hasattr(weight, "tensor_model_parallel"):
            tpl.set_tensor_model_parallel_attributes(weight, is_parallel=True, dim=dim, stride=1)


def init_parallel(seed: int, tp: int = 1, pp: int = 1, ep: int = 1) -> None:
    """TP x PP (x DP, the rest of the world) over the default process group (gloo on CPU, NCCL
    on GPU), experts split over EP ranks carved out of DP (expert TP = TP), seeded RNG tracker."""
    parallel_state = _megatron()[0]
    shim.install()
    # No extra gloo groups: the actor's own reductions use megatron's groups of the default backend.
    parallel_state.initialize_model_parallel(tp, pp, expert_model_parallel_size=ep,
                                             create_gloo_process_groups=False)
    shim.seed_model_parallel_rng(seed, parallel_state.get_tensor_model_parallel_rank(),
                                 parallel_state.get_expert_model_parallel_rank(),
                                 parallel_state.get_expert_tensor_parallel_rank())


def parallel_state():
    """megatron-core's `parallel_state` module (this rank's groups and coordinates)."""
    return _megatron()[0]


def destroy_parallel() -> None:
    parallel_state = _megatron()[0]
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
