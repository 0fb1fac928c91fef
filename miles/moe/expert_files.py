"""A mixture-of-experts checkpoint's per-expert tensors, fused as transformers holds them in memory.

transformers 5 keeps a Qwen3-MoE layer's experts fused (`mlp.experts.gate_up_proj` [E, 2I, H],
gate rows first, then up; `mlp.experts.down_proj` [E, H, I]) while `save_pretrained` writes one
tensor per expert and projection (`mlp.experts.{e}.gate_proj.weight` ...), and `from_pretrained`
fuses them back. Whoever reads the files itself (the engine's disk update, Megatron's load) fuses
them the same way; a checkpoint that already holds the fused names passes through unchanged.
"""
from __future__ import annotations

import re
from collections import defaultdict
from typing import Callable

import torch

_PER_EXPERT = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<expert>\d+)\."
                         r"(?P<proj>gate_proj|up_proj|down_proj)\.weight$")
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


class ExpertFusionError(ValueError):
    """A checkpoint whose per-expert tensors do not make whole fused ones."""


def fuse_experts(tensors: dict[str, torch.Tensor],
                 fuses: Callable[[str], bool] = lambda prefix: True) -> dict[str, torch.Tensor]:
    """`tensors` with the per-expert projections of each `...experts` prefix for which `fuses` is
    true stacked into that prefix's `gate_up_proj` and `down_proj`; every other tensor as it is.
    Raises ExpertFusionError naming the prefix when an expert or a projection is missing."""
    out: dict[str, torch.Tensor] = {}
    layers: dict[str, dict[tuple[int, str], torch.Tensor]] = defaultdict(dict)
    for name, tensor in tensors.items():
        match = _PER_EXPERT.match(name)
        if match is None or not fuses(match["prefix"]):
            out[name] = tensor
            continue
        layers[match["prefix"]][(int(match["expert"]), match["proj"])] = tensor
    for prefix, parts in layers.items():
        experts = sorted({expert for expert, _ in parts})
        missing = [f"{prefix}.{e}.{p}.weight" for e in range(len(experts)) for p in PROJECTIONS
                   if (e, p) not in parts]
        if experts != list(range(len(experts))) or missing:
            raise ExpertFusionError(f"{prefix}: the checkpoint's experts are incomplete "
                                    f"(experts {experts}; missing {missing[:3]})")
        out[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([parts[(e, "gate_proj")], parts[(e, "up_proj")]]) for e in experts])
        out[f"{prefix}.down_proj"] = torch.stack([parts[(e, "down_proj")] for e in experts])
    return out
