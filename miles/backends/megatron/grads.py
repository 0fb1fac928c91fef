"""Gradient reduction, norms and clipping for a model split over tensor and pipeline parallel ranks.

- Data parallel: every replica's gradients are averaged over the data-parallel group only (the
  other ranks of the world hold other shards).
- Experts under expert parallelism: an expert lives on one rank of its EP group, and its gradient
  there already sums the contributions of every EP rank's tokens (the all-to-all's backward). It
  is summed over the expert-data-parallel group (the ranks holding the same experts) and divided
  by the data-parallel size, as megatron's DDP scales it, so it is the gradient of the same mean
  loss the dense weights take (at EP = 1 the expert-data-parallel group is the data-parallel one).
- Per-head q/k norms under TP: each TP rank applies the replicated weight to its own heads only, so
  its gradient is a partial sum; the partials are summed over the TP group (megatron's
  `finalize_model_grads` does the same for `q_layernorm` / `k_layernorm`). With sequence parallel
  the same holds for every weight marked `sequence_parallel` (the norms, an MoE router): each TP
  rank applies it to its own chunk of the sequence.
- Tied embeddings at PP > 1: the first stage's embedding and the last stage's output layer are one
  HF tensor held twice; their gradients are summed over megatron's embedding group (first and last
  stage), as megatron's `finalize_model_grads` does, so both copies take the same step.
- Norms: a TP-sharded parameter (`tensor_model_parallel`) contributes its shard on every TP rank, a
  replicated one (norms) only on TP rank 0, the last stage's copy of a tied embedding (`shared`)
  never; the squares are summed over the model-parallel group (TP x PP), so every rank gets the norm
  of the whole model, the number TP = PP = 1 gives. The experts' squares are summed over the
  expert-model-parallel group (expert TP x EP x PP) instead, where each expert is once.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from miles.backends.megatron.convert import is_expert
from miles.backends.ppo import squared_norm


def _all_reduce_divided(tensors: list[torch.Tensor], group, size: int) -> None:
    """One all-reduce (SUM) of the flattened tensors, divided by `size`: the mean over a group of
    `size` (gloo has no AVG), or the plain sum with `size` 1."""
    flat = _flatten_dense_tensors(tensors)
    dist.all_reduce(flat, group=group)
    flat.div_(size)
    for tensor, averaged in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
        tensor.copy_(averaged)


QK_NORMS = ("q_layernorm", "k_layernorm")


def partial_over_tp(name: str, param) -> bool:
    """A replicated weight each TP rank applies to its own part of the tokens or heads: its
    gradient is summed over the TP group."""
    return any(part in name for part in QK_NORMS) or bool(getattr(param, "sequence_parallel",
                                                                  False))


def reduce_gradients(model, parallel_state) -> None:
    """Sum the q/k norms' (and with sequence parallel the norms' and routers') partial gradients
    over TP, average over the data-parallel group, then sum the tied embedding's two copies."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    for p in params:
        if p.grad is None:  # a rank whose micro-batches never reached a parameter still takes part
            p.grad = torch.zeros_like(p)
    partial = [p.grad for n, p in named if partial_over_tp(n, p)]
    if partial and parallel_state.get_tensor_model_parallel_world_size() > 1:
        _all_reduce_divided(partial, parallel_state.get_tensor_model_parallel_group(), 1)
    dp = parallel_state.get_data_parallel_world_size()
    dense = [p.grad for n, p in named if not is_expert(n)]
    experts = [p.grad for n, p in named if is_expert(n)]
    if dp > 1 and dense:
        _all_reduce_divided(dense, parallel_state.get_data_parallel_group(), dp)
    if dp > 1 and experts:
        _all_reduce_divided(experts, parallel_state.get_expert_data_parallel_group(), dp)
    if tied_across_stages(model, parallel_state) and parallel_state.is_rank_in_embedding_group():
        dist.all_reduce(model.shared_embedding_or_output_weight().grad,
                        group=parallel_state.get_embedding_group())


def tied_across_stages(model, parallel_state) -> bool:
    return bool(model.share_embeddings_and_output_weights) and \
        parallel_state.get_pipeline_model_parallel_world_size() > 1


def counted(param, tp_rank: int) -> bool:
    """Whether this rank's copy of `param` counts in the model's norms (each weight once)."""
    if getattr(param, "shared", False):  # the last stage's copy of the tied embedding
        return False
    return bool(getattr(param, "tensor_model_parallel", False)) or tp_rank == 0


def model_norm(tensors: list[tuple[torch.nn.Parameter, torch.Tensor]], parallel_state,
               experts: list[tuple[torch.nn.Parameter, torch.Tensor]] = ()) -> float:
    """The L2 norm over the whole model of per-parameter tensors (weights or gradients): the dense
    ones in `tensors`, the experts' in `experts`."""
    total = _squares(tensors, parallel_state, parallel_state.get_model_parallel_group())
    if experts:
        group = parallel_state.get_expert_tensor_model_pipeline_parallel_group()
        total += _squares(experts, parallel_state, group)
    return float(total.sqrt())


def _squares(tensors, parallel_state, group) -> torch.Tensor:
    """The sum of squares of the tensors each weight counts once in, over `group`."""
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    total = torch.zeros((), dtype=torch.float64)
    for param, tensor in tensors:
        if counted(param, tp_rank):
            total += squared_norm(tensor)
    if dist.get_world_size(group) > 1:
        dist.all_reduce(total, group=group)
    return total


def split_experts(model, of) -> tuple[list, list]:
    """(dense, experts) pairs (param, of(param)) of the model's parameters, `of` not None."""
    dense, experts = [], []
    for name, param in model.named_parameters():
        value = of(param)
        if value is not None:
            (experts if is_expert(name) else dense).append((param, value))
    return dense, experts


@torch.no_grad()
def clip(model, limit: float, parallel_state) -> float:
    """The global grad norm; gradients scaled by limit / norm when it is larger (as torch's
    clip_grad_norm_)."""
    params = [p for p in model.parameters() if p.grad is not None]
    dense, experts = split_experts(model, lambda p: p.grad)
    norm = model_norm(dense, parallel_state, experts)
    scale = limit / (norm + 1e-6)
    if scale < 1.0:
        torch._foreach_mul_([p.grad for p in params], scale)
    return norm
