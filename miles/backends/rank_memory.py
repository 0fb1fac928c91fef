"""What one training rank holds: its parameters', gradients' and optimizer state's bytes, and its
peak memory, so a parallel layout's saving shows (TP=2: each rank holds about half the weights).

Counted from the tensors the rank itself owns: a sharded parameter (an FSDP DTensor) counts its
local shard, a Megatron TP/PP rank its own slice of its own stage. The reference model
(--use-kl-loss) is not counted: it holds no gradients or optimizer state. Peak memory is the
device's: torch's allocator peak on a GPU (`torch.cuda.max_memory_allocated`), the process's peak
resident set on CPU (`ru_maxrss`, which also holds the interpreter and libraries).
"""
from __future__ import annotations

import resource
import sys

import torch

KINDS = ("param_bytes", "grad_bytes", "optimizer_bytes", "peak_memory_bytes")


def tensor_bytes(tensor: torch.Tensor) -> int:
    # a DTensor (FSDP): only this rank's shard is held here
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def peak_rss_bytes() -> int:
    """This process's peak resident set (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def peak_memory_bytes(device: torch.device | None) -> int:
    if device is not None and device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return peak_rss_bytes()


def rank_memory(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                device: torch.device | None) -> dict[str, float]:
    """{kind: bytes} of this rank (KINDS), taken after its optimizer steps (gradients held)."""
    params = list(model.parameters())
    optim_state = optimizer.state.values() if optimizer is not None else []
    return {
        "param_bytes": float(sum(tensor_bytes(p) for p in params)),
        "grad_bytes": float(sum(tensor_bytes(p.grad) for p in params if p.grad is not None)),
        "optimizer_bytes": float(sum(tensor_bytes(v) for state in optim_state
                                     for v in state.values() if torch.is_tensor(v))),
        "peak_memory_bytes": float(peak_memory_bytes(device)),
    }


def rank_memory_metrics(results) -> dict[str, float]:
    """`perf/rank_<r>_<kind>` for each rank (results in rank order) and `perf/max_rank_<kind>`: the
    most any rank holds, the figure that decides whether a layout fits. {} from ranks that reported
    none."""
    out: dict[str, float] = {}
    for rank, result in enumerate(results):
        for kind, value in (getattr(result, "memory", None) or {}).items():
            out[f"perf/rank_{rank}_{kind}"] = value
            out[f"perf/max_rank_{kind}"] = max(value, out.get(f"perf/max_rank_{kind}", 0.0))
    return out
