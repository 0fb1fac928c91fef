"""What megatron-core's sequence parallel (`--sequence-parallel`) needs around it on this backend.

With sequence parallel, the activations outside the tensor-parallel regions (norms, residuals, the
MoE router) are split along the sequence over the TP ranks: the embedding's output is scattered,
the column-parallel layers all-gather their input, the row-parallel ones reduce-scatter their
output, and the output layer gathers the last norm's output before the vocab-parallel logits.

- Sequences are padded to a multiple of TP (megatron-core splits the sequence evenly) on the
  right, where the causal mask keeps every real token from reading them; the logits of the pad
  positions are dropped before any log-prob or loss, and an MoE router leaves them out of its
  load-balancing figures (megatron's `padding_mask`).
- Norms run on each rank's own sequence chunk, so their weights' gradients are partial sums: they
  are marked `sequence_parallel` (megatron-core's fused and Transformer Engine norms mark
  themselves; its torch norm refuses sequence parallel outright, though an RMSNorm is per token)
  and `grads.reduce_gradients` sums them over the TP group, as megatron's `finalize_model_grads`
  does. The MoE router marks its own weight.
"""
from __future__ import annotations

import torch


class SequenceParallelTorchNorm:
    """megatron-core's `WrappedTorchNorm` (torch's RMSNorm or LayerNorm) that allows sequence
    parallel: its weight marked `sequence_parallel`, so its partial gradients are summed over TP."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **_unused):
        kinds = {"RMSNorm": torch.nn.RMSNorm, "LayerNorm": torch.nn.LayerNorm}
        if config.normalization not in kinds:
            raise ValueError(f"normalization {config.normalization!r} is not supported")
        norm = kinds[config.normalization](normalized_shape=hidden_size, eps=eps)
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel
        return norm


def with_sequence_parallel_norms(spec):
    """A layer spec (megatron's ModuleSpec tree) with every `WrappedTorchNorm` replaced by
    `SequenceParallelTorchNorm`, in place; returns it."""
    import dataclasses

    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    def swap(node):
        if node is WrappedTorchNorm:
            return SequenceParallelTorchNorm
        if dataclasses.is_dataclass(node) and not isinstance(node, type):
            for field in dataclasses.fields(node):
                setattr(node, field.name, swap(getattr(node, field.name)))
        elif isinstance(node, list):
            return [swap(item) for item in node]
        return node

    return swap(spec)


def block_spec(layer_spec, config, pp_rank: int):
    """The transformer block of this pipeline stage: its layers and its final norm, with norms
    that allow sequence parallel."""
    from megatron.core.transformer.transformer_block import (TransformerBlockSubmodules,
                                                             get_num_layers_to_build)

    layers = get_num_layers_to_build(config, vp_stage=None, pp_rank=pp_rank)
    layer = with_sequence_parallel_norms(layer_spec)
    return TransformerBlockSubmodules(layer_specs=[layer] * layers,
                                      layer_norm=SequenceParallelTorchNorm)


def padded_length(length: int, tp: int) -> int:
    """The sequence length megatron-core can split over `tp` ranks: the next multiple of tp."""
    return -(-length // tp) * tp


def pad_right(input_ids: torch.Tensor, tp: int, pad_id: int = 0) -> tuple[torch.Tensor,
                                                                       torch.Tensor | None]:
    """(B, T) ids padded on the right to a multiple of `tp`, and the padding mask (True: an added
    position; None when nothing was added)."""
    b, t = input_ids.shape
    extra = padded_length(t, tp) - t
    if not extra:
        return input_ids, None
    pad = input_ids.new_full((b, extra), pad_id)
    mask = torch.zeros(b, t + extra, dtype=torch.bool, device=input_ids.device)
    mask[:, t:] = True
    return torch.cat([input_ids, pad], dim=1), mask


def own_chunk(padding: torch.Tensor) -> torch.Tensor:
    """This TP rank's sequence chunk of a (B, T) padding mask: what the first stage's GPTModel
    scatters itself, for the later stages' routers."""
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size()
    rank = parallel_state.get_tensor_model_parallel_rank()
    return padding.chunk(tp, dim=1)[rank].contiguous()
