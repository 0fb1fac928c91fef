"""A mixture-of-experts checkpoint's per-expert tensors, fused as the served model holds them.

transformers 5 keeps a Qwen3-MoE layer's experts fused in memory (`mlp.experts.gate_up_proj`
[E, 2I, H], gate rows first, then up; `mlp.experts.down_proj` [E, H, I]) while `save_pretrained`
writes one tensor per expert and projection (`mlp.experts.{e}.gate_proj.weight` ...), and
`from_pretrained` fuses them back. The engine's disk update reads the files itself, so it fuses
the same way before the names are checked against the served model's state dict; a checkpoint
that already holds the fused names (what a trainer's export writes) passes through unchanged.
"""
from __future__ import annotations

import re
from collections import defaultdict

import torch

from miles.engines.weight_update import WeightUpdateError

_PER_EXPERT = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<expert>\d+)\."
                         r"(?P<proj>gate_proj|up_proj|down_proj)\.weight$")
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


class ExpertFusionError(WeightUpdateError):
    """A checkpoint whose per-expert tensors do not make whole fused ones (refused as any bad
    update is)."""


def fuse_experts(tensors: dict[str, torch.Tensor], served_names) -> dict[str, torch.Tensor]:
    """`tensors` with each layer's per-expert projections stacked into the fused names the served
    model has (`served_names`: its state dict's keys); every other tensor as it is."""
    out: dict[str, torch.Tensor] = {}
    layers: dict[str, dict[tuple[int, str], torch.Tensor]] = defaultdict(dict)
    for name, tensor in tensors.items():
        match = _PER_EXPERT.match(name)
        if match is None or f"{match['prefix']}.gate_up_proj" not in served_names:
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
