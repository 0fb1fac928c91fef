"""Full (unsharded) weights of an FSDP2 model: gathering, HF-layout files, and loading them back."""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

WEIGHTS_FILE = "model.safetensors"
TIED_HEAD = "lm_head.weight"
TIED_EMBED = "model.embed_tokens.weight"
# Files of the base checkpoint that are not weights (config, tokenizer, generation config).
SKIP_SUFFIXES = (".safetensors", ".bin", ".pt", ".index.json")


def gather_full(model, on_all_ranks: bool = False) -> dict[str, torch.Tensor]:
    """Collective. Full CPU tensors on rank 0 (on every rank with `on_all_ranks`); empty elsewhere."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=not on_all_ranks)
    state = get_model_state_dict(model, options=options)
    return {k: v.detach().cpu() for k, v in state.items()}


def drop_tied(state: dict[str, torch.Tensor], tied: bool) -> dict[str, torch.Tensor]:
    """Safetensors refuses shared tensors; a tied head is rebuilt from the embedding on load."""
    if tied:
        state = {k: v for k, v in state.items() if k != TIED_HEAD}
    return {k: v.contiguous() for k, v in state.items()}


def write_hf_checkpoint(state: dict[str, torch.Tensor], directory: Path, base_model: Path, tied: bool) -> list[str]:
    """An HF checkpoint any loader (engine, from_pretrained) reads: weights + the base's config files."""
    directory.mkdir(parents=True, exist_ok=True)
    save_file(drop_tied(state, tied), str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    written = [WEIGHTS_FILE]
    for item in sorted(base_model.iterdir()):
        if item.is_file() and not item.name.endswith(SKIP_SUFFIXES) and item.name != "warmstart.json":
            shutil.copy2(item, directory / item.name)
            written.append(item.name)
    return written


def read_hf_weights(directory: Path, tied: bool) -> dict[str, torch.Tensor]:
    state = load_file(str(directory / WEIGHTS_FILE))
    if tied and TIED_HEAD not in state:
        state[TIED_HEAD] = state[TIED_EMBED]
    return state


def digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].contiguous().numpy().tobytes())
    return h.hexdigest()
