"""Full weights as an HF checkpoint (the layout every backend saves and the engines load), read back, hashed."""
from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

WEIGHTS_FILE = "model.safetensors"
SHARDED_INDEX = "model.safetensors.index.json"  # what large HF checkpoints ship instead of one file
TIED_HEAD = "lm_head.weight"
TIED_EMBED = "model.embed_tokens.weight"
# Files of the base checkpoint that are not weights (config, tokenizer, generation config).
SKIP_SUFFIXES = (".safetensors", ".bin", ".pt", ".index.json")


@contextlib.contextmanager
def no_loading_bar():
    """transformers' progress bars (its "Loading weights" bar, the Hub's downloads) off while the block
    runs, then back as they were: a training rank loads the model the engine has just loaded, and a
    second bar for the same weights is only noise in the run's output."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


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
    """One `model.safetensors` (what the backends write) or the shards an index names."""
    if (directory / WEIGHTS_FILE).exists() or not (directory / SHARDED_INDEX).exists():
        state = load_file(str(directory / WEIGHTS_FILE))
    else:
        shards = sorted(set(json.loads((directory / SHARDED_INDEX).read_text())["weight_map"].values()))
        state = {k: v for shard in shards for k, v in load_file(str(directory / shard)).items()}
    if tied and TIED_HEAD not in state:
        state[TIED_HEAD] = state[TIED_EMBED]
    return state


def digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].contiguous().numpy().tobytes())
    return h.hexdigest()
