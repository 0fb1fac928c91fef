"""Push new policy weights from the trainer to a running engine: from a checkpoint directory or in memory.

`push_weights_in_memory` serializes the named tensors with safetensors into the request
body of `/update_weights_from_tensor` (the embedded engine's co-located path: no disk).
Real SGLang engines take `push_weights_from_disk`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import httpx

from miles.serving.auth import bearer
from miles.serving.control_http import control_client

DEFAULT_TIMEOUT_S = 600.0


class WeightPushError(RuntimeError):
    """The engine refused or failed a weight update; the message is the engine's own."""


@dataclass(frozen=True)
class WeightPushResult:
    url: str
    weight_version: str | None
    message: str
    seconds: float
    bytes_sent: int = 0


def _result(url: str, response: httpx.Response, sent: int) -> WeightPushResult:
    try:
        body = response.json()
    except ValueError:
        body = {"success": False, "message": response.text[:500]}
    if response.status_code != 200 or not body.get("success", False):
        raise WeightPushError(f"{url} refused the weight update (HTTP {response.status_code}): "
                              f"{body.get('message', body)}")
    return WeightPushResult(url=url, weight_version=body.get("weight_version"), message=body.get("message", ""),
                            seconds=response.elapsed.total_seconds(), bytes_sent=sent)


def push_weights_from_disk(url: str, model_dir: str | Path, version: str,
                           timeout: float = DEFAULT_TIMEOUT_S, token: str | None = None) -> WeightPushResult:
    """Ask the engine at `url` to load the HF checkpoint in `model_dir` and report `version`."""
    payload = {"model_path": str(model_dir), "weight_version": str(version)}
    response = control_client().post(f"{url.rstrip('/')}/update_weights_from_disk", json=payload, headers=bearer(token),
                          timeout=timeout)
    return _result(url, response, 0)


def serialize_state_dict(state_dict: Mapping[str, "torch.Tensor"]) -> bytes:
    """safetensors bytes of the tensors, on CPU; tied (storage-sharing) tensors are sent once."""
    import torch
    from safetensors.torch import save

    seen: set[tuple[int, int, tuple]] = set()
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        if hasattr(tensor, "full_tensor"):  # an FSDP2 DTensor shard: gather the whole parameter
            tensor = tensor.full_tensor()
        tensor = tensor.detach()
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            continue  # the engine updates every tied name of a parameter from any one of them
        seen.add(key)
        tensors[name] = tensor.to("cpu").contiguous()
    return save(tensors)


def push_weights_in_memory(url: str, state_dict: Mapping[str, "torch.Tensor"], version: str,
                           timeout: float = DEFAULT_TIMEOUT_S, token: str | None = None) -> WeightPushResult:
    """Send the named tensors to the engine's `/update_weights_from_tensor` and report `version`."""
    blob = serialize_state_dict(state_dict)
    response = control_client().post(f"{url.rstrip('/')}/update_weights_from_tensor", content=blob,
                          params={"weight_version": str(version)},
                          headers={"content-type": "application/octet-stream", **bearer(token)}, timeout=timeout)
    return _result(url, response, len(blob))
