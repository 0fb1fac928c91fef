"""Full (unsharded) weights of an FSDP2 model, gathered from the ranks' shards."""
from __future__ import annotations

import torch


def gather_full(model, on_all_ranks: bool = False) -> dict[str, torch.Tensor]:
    """Collective. Full CPU tensors on rank 0 (on every rank with `on_all_ranks`); empty elsewhere."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # DTensor: ranks only

    options = StateDictOptions(full_state_dict=True, cpu_offload=not on_all_ranks)
    state = get_model_state_dict(model, options=options)
    return {k: v.detach().cpu() for k, v in state.items()}
