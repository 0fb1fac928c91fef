"""The engine's disk update fuses a MoE checkpoint's per-expert files into the served model's
fused expert tensors (miles/moe/expert_files.py) before the names are checked against the served
model's state dict; an incomplete set is refused as any bad update is."""
from __future__ import annotations

import torch

from miles.engines.weight_update import WeightUpdateError
from miles.moe import expert_files


class ExpertFusionError(WeightUpdateError):
    """A checkpoint whose per-expert tensors do not make whole fused ones."""


def fuse_experts(tensors: dict[str, torch.Tensor], served_names) -> dict[str, torch.Tensor]:
    """`tensors` with each layer's per-expert projections stacked into the fused names the served
    model has (`served_names`: its state dict's keys); every other tensor as it is."""
    try:
        return expert_files.fuse_experts(
            tensors, lambda prefix: f"{prefix}.gate_up_proj" in served_names)
    except expert_files.ExpertFusionError as exc:
        raise ExpertFusionError(str(exc)) from None
