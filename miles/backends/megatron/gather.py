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

A broadcast weight push gathers less: each pipeline stage only its own layers, over its TP group
(`gather_stage_hf`), as Miles' per-stage weight update groups do.
"""
from __future__ import annotations

import re

import torch
import torch.distributed as dist

from miles.backends.megatron import convert

_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.*)")


def gather_hf(local: dict[str, torch.Tensor], lay: convert.Layout, par: convert.Parallel,
              group, ep_group=None, to_first: bool = False) -> dict[str, torch.Tensor] | None:
    """Collective over the model-parallel `group` (and with EP > 1 first over `ep_group`): this
    rank's local-named tensors (CPU) -> the whole HF state dict, on every member; with `to_first`
    on the group's first member only (None elsewhere). A writer needs it once: gathered on every
    member, SmolLM2 at TP=3 held four copies of the model per rank and a push ran out of memory."""
    if par.ep_size > 1:
        local = gather_experts(local, lay, ep_group)
    if par.tp_size * par.pp_size == 1:
        return convert.megatron_shards_to_hf({(0, 0): local}, lay, 1, 1)
    mine = ((par.tp_rank, par.pp_rank), local)
    parts = gather_to_first(mine, group) if to_first else gather_objects(mine, group)
    if parts is None:
        return None
    return convert.megatron_shards_to_hf(dict(parts), lay, par.tp_size, par.pp_size)


def gather_stage_hf(local: dict[str, torch.Tensor], lay: convert.Layout, par: convert.Parallel,
                    tp_group, ep_group=None) -> dict[str, torch.Tensor]:
    """Collective over the tensor-parallel `tp_group` (and with EP > 1 first over `ep_group`):
    this rank's pipeline stage in HF names and layout (`stage_hf`), on every member."""
    if par.ep_size > 1:
        local = gather_experts(local, lay, ep_group)
    shards = gather_objects(local, tp_group) if par.tp_size > 1 else [local]
    return stage_hf(shards, lay, par)


def stage_hf(shards: list[dict[str, torch.Tensor]], lay: convert.Layout,
             par: convert.Parallel) -> dict[str, torch.Tensor]:
    """Pipeline stage `par.pp_rank`'s part of the HF state dict from its TP ranks' shards (TP
    rank order): its layers, numbered globally; the embedding on the first stage; the final norm
    and an untied lm_head on the last. A tied lm_head is not among them (the last stage's copy of
    the embedding would send the first stage's tensor twice; the engine ties it), so the stages'
    parts together are the whole model once, as `megatron_shards_to_hf` less a tied head."""
    def gathered(prefix: str, name: str) -> torch.Tensor:
        return convert._tp_gather(name, [shard[prefix + name] for shard in shards])

    def vocab(name: str) -> torch.Tensor:
        return torch.cat([shard[name] for shard in shards])[:lay.vocab_size]

    out = {}
    if par.first_stage:
        out[convert.EMBED[1]] = vocab(convert.EMBED[0])
    if par.last_stage:
        out[convert.FINAL_NORM[1]] = shards[0][convert.FINAL_NORM[0]]
        if not lay.tied:
            out[convert.OUTPUT[1]] = vocab(convert.OUTPUT[0])
    layers = convert.stage_layers(lay.num_layers, par.pp_size, par.pp_rank)
    for local, index in enumerate(layers):
        prefix = f"decoder.layers.{local}."
        names = [k[len(prefix):] for k in shards[0] if k.startswith(prefix)]
        out.update(convert._layer_to_hf({n: gathered(prefix, n) for n in names}, lay, index))
    return out


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


def gather_to_first(value, group) -> list | None:
    """Every member's `value` on the group's first member, in group rank order; None elsewhere."""
    first = dist.get_global_rank(group, 0)
    parts = [None] * dist.get_world_size(group) if dist.get_rank() == first else None
    dist.gather_object(value, parts, dst=first, group=group)
    return parts


def gather_objects(value, group) -> list:
    """Every member's `value`, in group rank order (a single member: no communication)."""
    size = dist.get_world_size(group)
    if size == 1:
        return [value]
    parts: list = [None] * size
    dist.all_gather_object(parts, value, group=group)
    return parts
