"""A model replica's shards gathered into HF names and layout (weights, and tensors like them).

The ranks of one model-parallel group (TP x PP, one data-parallel replica) each hold their stage's
layers and their TP slices; `gather_hf` collects the group's shards on every member and converts
them with `convert.megatron_shards_to_hf` (TP gathered, fused layouts undone, vocab pad stripped,
layers numbered globally). With expert parallelism each rank holds a slice of the experts, and the
EP group (ranks of other data parallel replicas) first pools them, numbered globally, so every
member then holds every expert and the model-parallel gather proceeds as without experts. Adam's
moments go the same way, so a checkpoint's optimizer state is in
HF names whatever the layout: a run resumes with the same layout bit for bit, or with another one
(its shards cut anew from the HF-named state), and the FSDP backend reads it unchanged.
"""
from __future__ import annotations

import re

import torch
import torch.distributed as dist

from miles.backends.megatron import convert

_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.*)")


def gather_hf(local: dict[str, torch.Tensor], lay: convert.Layout, par: convert.Parallel,
              group, ep_group=None) -> dict[str, torch.Tensor]:
    """Collective over the model-parallel `group` (and with EP > 1 first over `ep_group`): this
    rank's local-named tensors (CPU) -> the whole HF state dict, on every member."""
    if par.ep_size > 1:
        local = gather_experts(local, lay, ep_group)
    if par.tp_size * par.pp_size == 1:
        shards = {(0, 0): local}
    else:
        parts: list = [None] * dist.get_world_size(group)
        dist.all_gather_object(parts, ((par.tp_rank, par.pp_rank), local), group=group)
        shards = dict(parts)
    return convert.megatron_shards_to_hf(shards, lay, par.tp_size, par.pp_size)


def gather_experts(local: dict[str, torch.Tensor], lay: convert.Layout,
                   ep_group) -> dict[str, torch.Tensor]:
    """Collective over the EP group: this rank's tensors with every EP rank's experts, numbered
    globally (the dense ones are this rank's own: the same on every EP rank)."""
    experts = {n: t for n, t in local.items() if convert.is_expert(n)}
    merged = convert.merge_expert_shards(gather_objects(experts, ep_group), lay)
    return {**{n: t for n, t in local.items() if not convert.is_expert(n)}, **merged}


def global_name(local: str, lay: convert.Layout, par: convert.Parallel) -> str:
    """A stage's parameter name with its layer numbered as in the whole model (PP layer offset)
    and its expert as in the whole layer (EP expert offset)."""
    match = _LAYER.fullmatch(local)
    if match is None:
        return local
    offset = convert.stage_layers(lay.num_layers, par.pp_size, par.pp_rank).start
    name = f"decoder.layers.{offset + int(match[1])}.{match[2]}"
    if par.ep_size > 1 and convert.is_expert(name):
        first = convert.expert_range(lay, par).start
        (name,) = convert.renumber_experts({name: None}, first)
    return name


def gather_objects(value, group) -> list:
    """Every member's `value`, in group rank order (a single member: no communication)."""
    size = dist.get_world_size(group)
    if size == 1:
        return [value]
    parts: list = [None] * size
    dist.all_gather_object(parts, value, group=group)
    return parts
