"""The rollout's side of SGLang's `return_routed_experts`: when to ask, and reading the answer.

A sample's record is an integer array (tokens, MoE layers, top_k): the experts the engine routed
each token it read to (prompt and response but the last token). The embedded engine sends it as
base64 of the smallest integer type for the expert count with its dtype and shape beside it;
SGLang sends base64 int32 without them, so the shape then comes from the policy's config.
"""
from __future__ import annotations

import base64
import binascii
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

# config.json keys that count a model's routed experts (Qwen3-MoE, Mixtral, DeepSeek)
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "moe_topk")


class RoutedExpertsError(ValueError):
    """A routed-experts answer that cannot be read as (tokens, layers, top_k) expert ids."""


@lru_cache(maxsize=16)
def moe_shape(checkpoint: str) -> tuple[int, int, int] | None:
    """(experts, MoE layers, top_k) of the HF checkpoint at `checkpoint`; None: a dense model (or no
    config.json to read)."""
    path = Path(checkpoint) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    experts = next((int(config[k]) for k in _EXPERT_KEYS if config.get(k)), 0)
    if experts <= 0:
        return None
    top_k = next((int(config[k]) for k in _TOP_K_KEYS if config.get(k)), 1)
    layers = int(config.get("num_hidden_layers", 0)) - len(config.get("mlp_only_layers") or [])
    return experts, layers, top_k


def wanted_routing(args: Any) -> tuple[int, int] | None:
    """(MoE layers, top_k) when the run records routing (--record-routed-experts, on by default) and
    its policy has experts; None: the rollout does not ask."""
    if args is None or not getattr(args, "record_routed_experts", False):
        return None
    checkpoint = getattr(args, "hf_checkpoint", None)
    shape = None if checkpoint is None else moe_shape(str(checkpoint))
    return None if shape is None else shape[1:]


def read_routed_experts(meta: dict[str, Any],
                        fallback: tuple[int, int] | None = None) -> np.ndarray | None:
    """The record in a /generate answer's meta_info, or None when it has none. `fallback`: (layers,
    top_k) for an answer without its shape (SGLang's int32)."""
    encoded = meta.get("routed_experts")
    if encoded is None:
        return None
    try:
        dtype = np.dtype(meta.get("routed_experts_dtype", "int32"))
    except TypeError:
        dtype = np.dtype(np.float64)  # refused just below
    if dtype.kind != "i":
        raise RoutedExpertsError(f"routed_experts_dtype {meta.get('routed_experts_dtype')!r:.40} "
                                 f"is no integer type")
    try:
        flat = np.frombuffer(base64.b64decode(encoded, validate=True), dtype=dtype)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise RoutedExpertsError(f"routed_experts is not base64 of {dtype.name} values: "
                                 f"{exc}") from None
    shape = meta.get("routed_experts_shape")
    if shape is None:
        if fallback is None:
            raise RoutedExpertsError("routed_experts came without routed_experts_shape and the "
                                     "policy's (layers, top_k) are unknown")
        shape = [-1, *fallback]
    try:
        return flat.reshape(shape)
    except (ValueError, TypeError):
        raise RoutedExpertsError(f"{flat.size} routed expert ids do not fill the shape "
                                 f"{shape!r:.60}") from None


def stitched(turns: list[tuple[int, int, np.ndarray | None]]) -> np.ndarray | None:
    """One multi-turn sample's record from its turns' (tokens read before the turn's answer, answer
    length, that call's record): the last call's record (it read the whole trajectory but its last
    token), with the rows that routed each earlier answer's tokens as that answer's own call routed
    them (the later calls prefilled them again, maybe otherwise). None if any call sent none."""
    if not turns or any(record is None for _, _, record in turns):
        return None
    out = np.array(turns[-1][2])
    for read, answered, record in turns[:-1]:
        rows = slice(read - 1, read - 1 + answered)  # the positions that predict the answer
        out[rows] = record[rows]
    return out
