"""Read new weights (a checkpoint directory or safetensors bytes) and check they fit the served model.

Checking happens before anything is copied, so a bad update leaves the served weights
untouched; the scheduler then swaps the checked tensors in between two batches.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import load_file

# Config keys that must agree for two checkpoints to be the same architecture.
SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "vocab_size", "intermediate_size")


class WeightUpdateError(ValueError):
    """A weight update the engine refuses; the message says which path, tensor or shape is wrong."""


def read_checkpoint_dir(model_dir: str | Path, served_config) -> dict[str, torch.Tensor]:
    """All tensors of an HF safetensors checkpoint, after checking its config.json matches the served one."""
    path = Path(model_dir).expanduser()
    if not path.is_dir():
        raise WeightUpdateError(f"model_path does not exist or is not a directory: {model_dir}")
    config_path = path / "config.json"
    if not config_path.is_file():
        raise WeightUpdateError(f"{model_dir} has no config.json; it is not a Hugging Face checkpoint directory")
    try:
        new = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise WeightUpdateError(f"{model_dir}/config.json cannot be read as JSON: {exc}") from None
    if not isinstance(new, dict):
        raise WeightUpdateError(f"{model_dir}/config.json is not a JSON object")
    served = served_config.to_dict()
    if new.get("architectures") != served.get("architectures"):
        raise WeightUpdateError(f"{model_dir} is a {new.get('architectures')} checkpoint; the engine serves "
                                f"{served.get('architectures')}")
    for key in SHAPE_KEYS:
        if key in served and new.get(key) != served[key]:
            raise WeightUpdateError(f"{model_dir}: config {key}={new.get(key)!r} does not match the served "
                                    f"model's {served[key]!r}")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightUpdateError(f"{model_dir} holds no *.safetensors weight files")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            tensors.update(load_file(f))
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:  # truncated, not safetensors, unreadable
            raise WeightUpdateError(f"{f} cannot be read as safetensors: {exc}") from None
    return tensors


def read_safetensors_bytes(data: bytes) -> dict[str, torch.Tensor]:
    if not data:
        raise WeightUpdateError("the request body is empty; send the named tensors serialized with safetensors")
    try:
        return load_safetensors_bytes(data)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise WeightUpdateError(f"the request body is not a safetensors blob: {exc}") from None


def check_tensors(named: dict[str, torch.Tensor], model: torch.nn.Module, require_all: bool) -> None:
    """Every name must be a parameter of `model` with the same shape; with `require_all`, every
    parameter must be given (under any of its tied names). No tensor at all, one holding a NaN or an
    infinity, or one with a value the served dtype cannot hold (1e300 in float64 for a float32 model: the
    swap's cast would make it inf) is refused too: swapping either in would change the weight version and
    serve garbage."""
    if not named:
        raise WeightUpdateError("the update holds no tensors; send at least one parameter of the served model")
    live = model.state_dict()
    for name, tensor in named.items():
        if name not in live:
            raise WeightUpdateError(f"tensor {name!r} is not a parameter of the served model")
        if tuple(tensor.shape) != tuple(live[name].shape):
            raise WeightUpdateError(f"tensor {name!r} has shape {tuple(tensor.shape)}; the served model's is "
                                    f"{tuple(live[name].shape)}")
        if not (tensor.is_floating_point() or tensor.dtype == live[name].dtype):
            raise WeightUpdateError(f"tensor {name!r} has dtype {tensor.dtype}; expected floating point")
        if tensor.is_floating_point() and tensor.numel():
            # one pass, no tensor-sized mask (isfinite(...).all() was a third of a 538 MB push):
            # the extremes are NaN when any value is, infinite when any value is
            low, high = torch.aminmax(tensor.detach())
            if not (bool(torch.isfinite(low)) and bool(torch.isfinite(high))):
                raise WeightUpdateError(f"tensor {name!r} holds NaN or infinite values; the served weights are kept")
            _check_fits(name, torch.maximum(low.abs(), high.abs()), tensor.dtype, live[name].dtype)
    if require_all:
        missing = [names[0] for names in _tied_groups(model) if not any(n in named for n in names)]
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise WeightUpdateError(f"the checkpoint lacks {len(missing)} parameter(s) of the served model: {shown}")


def _check_fits(name: str, largest: torch.Tensor, sent: torch.dtype, dtype: torch.dtype) -> None:
    """Refuse a finite tensor (of dtype `sent`, largest magnitude `largest`) whose values overflow `dtype`
    when the swap casts them. The cast is monotonic, so the largest magnitude decides: it is cast alone
    (rounding as the swap's cast rounds)."""
    if not dtype.is_floating_point or torch.finfo(sent).max <= torch.finfo(dtype).max:
        return  # every finite value of a narrower (or the same) dtype fits
    if not bool(torch.isfinite(largest.to(dtype))):
        raise WeightUpdateError(f"tensor {name!r} holds a value of magnitude {float(largest):.4g}, beyond the "
                                f"served dtype {str(dtype).removeprefix('torch.')} (largest "
                                f"{torch.finfo(dtype).max:.4g}); the served weights are kept")


def check_served_finite(model: torch.nn.Module, source: str) -> None:
    """Every floating parameter of the loaded model is finite in the dtype it is served in (N6): a
    checkpoint with a NaN, or with values past that dtype's range (1e300 in float64 becomes inf in float32),
    would start and answer garbage. Raises WeightUpdateError naming the first such tensor. (Buffers are not
    weights: some models keep -inf masks there.)"""
    for name, tensor in model.named_parameters():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise WeightUpdateError(f"{source}: tensor {name!r} holds NaN or infinite values once loaded as "
                                    f"{str(tensor.dtype).removeprefix('torch.')}; the engine will not serve it")


def max_tensor_body(model: torch.nn.Module) -> int:
    """The largest /update_weights_from_tensor body the engine reads: every parameter and buffer once, in
    float32 or its own wider dtype, plus room for the safetensors header (names, shapes, offsets)."""
    tensors = [*model.parameters(), *model.buffers()]  # tied ones counted once
    data = sum(t.numel() * max(4, t.element_size()) for t in tensors)
    names = len(model.state_dict(keep_vars=True)) + sum(1 for _ in model.named_parameters(remove_duplicate=False))
    return data + names * 1024 + 2**20


def _tied_groups(model: torch.nn.Module) -> list[list[str]]:
    """Parameter names grouped by the tensor they share (tied embeddings are one group)."""
    groups: dict[int, list[str]] = defaultdict(list)
    for name, param in model.named_parameters(remove_duplicate=False):
        groups[id(param)].append(name)
    return list(groups.values())
