"""The MoE policy of the R3 tests: the tiny Qwen3-MoE with its router's weights scaled down (a
near-uniform router, as early in training: near-ties are common, so an engine in bfloat16 and a
trainer in float32 route some tokens differently) and its experts' scaled up tenfold (freshly
initialised experts are so alike that which one a token goes to hardly changes its log-prob;
trained ones differ)."""
from __future__ import annotations

from pathlib import Path

import torch

ROUTER_SCALE = 0.1
EXPERT_SCALE = 10.0


def moe_checkpoint(out: Path) -> Path:
    from miles.tiny.moe_model import build_tiny_moe_model
    from miles.tiny.warmstart import save_checkpoint

    model, tokenizer = build_tiny_moe_model(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".experts." in name:
                p.mul_(EXPERT_SCALE)
            elif name.endswith("mlp.gate.weight"):
                p.mul_(ROUTER_SCALE)
    save_checkpoint(model, tokenizer, out)
    return out
