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
    if to_first:  # a writer: the TP shards of one stage travel as raw bytes where they can
        where = gather_to_first((par.tp_rank, par.pp_rank), group)
        shards = gather_tensors_to_first(local, group)
        if shards is None:
            return None
        parts = list(zip(where, shards))
    else:
        parts = gather_objects(((par.tp_rank, par.pp_rank), local), group)
    return convert.megatron_shards_to_hf(dict(parts), lay, par.tp_size, par.pp_size)


def gather_stage_hf(local: dict[str, torch.Tensor], lay: convert.Layout, par: convert.Parallel,
                    tp_group, ep_group=None) -> dict[str, torch.Tensor] | None:
    """Collective over the tensor-parallel `tp_group` (and with EP > 1 first over `ep_group`):
    this rank's pipeline stage in HF names and layout (`stage_hf`) on the group's first member
    (the stage's source rank), None on the others."""
    if par.ep_size > 1:
        local = gather_experts(local, lay, ep_group)
    shards = gather_tensors_to_first(local, tp_group) if par.tp_size > 1 else [local]
    return None if shards is None else stage_hf(shards, lay, par)


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


def gather_tensors_to_first(local: dict[str, torch.Tensor], group) -> list | None:
    """Collective over `group`: every member's named tensors on the group's first member, in
    group rank order; None elsewhere. Where the members hold the same names, shapes and dtypes
    (a stage's TP shards) they travel as one flat buffer per dtype, raw bytes (pickled, a 101 MB
    stage took 0.26 s more at TP=2 than at TP=1); else as objects (`gather_to_first`)."""
    size = dist.get_world_size(group)
    if size == 1:
        return [local]
    layout = [(name, tuple(t.shape), t.dtype) for name, t in local.items()]
    if any(other != layout for other in gather_objects(layout, group)):
        return gather_to_first(local, group)
    first = dist.get_rank() == dist.get_global_rank(group, 0)
    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend(group) == "nccl" else torch.device("cpu"))
    out = [{} for _ in range(size)] if first else None
    for dtype in dict.fromkeys(t.dtype for t in local.values()):
        names = [name for name, _, kind in layout if kind == dtype]
        flat = torch.cat([local[n].reshape(-1) for n in names]).to(device)
        parts = [torch.empty_like(flat) for _ in range(size)] if first else None
        dist.gather(flat, parts, dst=dist.get_global_rank(group, 0), group=group)
        if first:
            for rank, part in enumerate(parts):
                for name, piece in zip(names, part.cpu().split([local[n].numel() for n in names])):
                    out[rank][name] = piece.view(local[name].shape)
    return [{name: shards[name] for name in local} for shards in out] if first else None


def gather_objects(value, group) -> list:
    """Every member's `value`, in group rank order (a single member: no communication)."""
    size = dist.get_world_size(group)
    if size == 1:
        return [value]
    parts: list = [None] * size
    dist.all_gather_object(parts, value, group=group)
    return parts
