"""Which experts the served model's routers chose, per token and MoE layer (SGLang's
`return_routed_experts`).

A forward hook on every router (the HF `mlp.gate` module: it returns (logits, weights, indices))
keeps the indices of the last forward pass. The scheduler cuts each request's own rows out of
them after every prefill and decode step, so continuous batching and left padding give every
request exactly its own tokens' choices. A request's record covers the tokens the model read:
its prompt and every generated token but the last (which no forward pass has read yet), as
SGLang's does. On the wire it is base64 of the smallest integer type that holds an expert id
(int8 up to 127 experts: 1 byte per token, layer and choice), with its dtype and shape beside it.
"""
from __future__ import annotations

import base64

import numpy as np
import torch

from miles.engines.sglang_request import RequestError

FIELD = "return_routed_experts"  # the request field, as SGLang names it


def compact_dtype(num_experts: int) -> np.dtype:
    """The smallest signed integer type that holds expert ids 0..num_experts-1."""
    for dtype in (np.int8, np.int16, np.int32):
        if num_experts - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.int64)


def moe_routers(model) -> list[torch.nn.Module]:
    """The model's top-k routers in layer order: each `mlp.gate` with a `top_k` (transformers'
    Qwen3-MoE `Qwen3MoeTopKRouter` and its kin); a dense layer's `mlp.gate_proj` is no router.
    Empty for a dense model."""
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    found = []
    for layer in layers:
        gate = getattr(getattr(layer, "mlp", None), "gate", None)
        if isinstance(gate, torch.nn.Module) and hasattr(gate, "top_k"):
            found.append(gate)
    return found


class RoutingCapture:
    """Keeps the expert indices each router chose in the model's last forward pass."""

    def __init__(self, model):
        self.routers = moe_routers(model)
        self.top_k = int(self.routers[0].top_k) if self.routers else 0
        # the router's weight is (E, H)
        self.num_experts = int(self.routers[0].weight.shape[0]) if self.routers else 0
        self.dtype = compact_dtype(self.num_experts)
        self._last: list[torch.Tensor | None] = [None] * len(self.routers)
        for i, router in enumerate(self.routers):
            router.register_forward_hook(self._keeper(i))

    @property
    def is_moe(self) -> bool:
        return bool(self.routers)

    def _keeper(self, layer: int):
        def keep(module, _inputs, output) -> None:
            # (logits, weights, indices) as Qwen3-MoE's router returns them; a router of another
            # shape is kept as None (never an error in a forward that did not ask)
            fits = isinstance(output, tuple) and len(output) == 3 and torch.is_tensor(output[2]) \
                and not output[2].is_floating_point()
            self._last[layer] = output[2].detach() if fits else None  # (batch * time, top_k)
        return keep

    def select_rows(self, index: torch.Tensor, batch: int) -> None:
        """Make the last forward of `batch` rows read as one of rows `index` (a prefill that ran each
        distinct prompt once and copied it to every row holding it)."""
        for i, kept in enumerate(self._last):
            if kept is not None:
                k = kept.shape[-1]
                self._last[i] = kept.reshape(batch, -1, k)[index].reshape(-1, k)

    def last(self, batch: int) -> np.ndarray:
        """The last forward's choices as (batch, time, layers, top_k) in the compact dtype."""
        if any(t is None for t in self._last):
            kind = type(self.routers[0]).__name__
            raise RuntimeError(f"{FIELD}: this model's routers ({kind}) do not return expert "
                               f"indices as transformers' Qwen3-MoE router does (logits, weights, "
                               f"indices)")
        stacked = torch.stack([t.reshape(batch, -1, self.top_k) for t in self._last], dim=2)
        return stacked.cpu().numpy().astype(self.dtype)


def check_asked(asked: bool, capture: RoutingCapture | None) -> None:
    """A request asking a model without experts for its routing is refused (400), naming the
    field."""
    if asked and (capture is None or not capture.is_moe):
        raise RequestError(f"{FIELD} needs a mixture-of-experts model; the served model has no "
                           f"expert routers", param=FIELD)


def prefill_rows(choices: np.ndarray, lengths: list[int]) -> list[np.ndarray]:
    """Each row's own tokens of a left-padded prefill: row i's `lengths[i]` tokens end the time
    axis."""
    width = choices.shape[1]
    return [choices[i, width - n:].copy() for i, n in enumerate(lengths)]


def record_prefill(capture: RoutingCapture, requests: list) -> None:
    """After a prefill of `requests` (each read prompt + tokens so far, left-padded): each request
    that asked keeps its rows (a retracted request's record restarts here, as its cache does)."""
    if not any(r.return_routed_experts for r in requests):
        return
    lengths = [len(r.prompt_ids) + len(r.output_ids) for r in requests]
    for req, rows in zip(requests, prefill_rows(capture.last(len(requests)), lengths)):
        if req.return_routed_experts:
            req.routed_experts = [rows]


def record_decode(capture: RoutingCapture, requests: list) -> None:
    """After a decode step of `requests` (one token each, in batch order): each asker keeps its
    row."""
    if not any(r.return_routed_experts for r in requests):
        return
    step = capture.last(len(requests))
    for i, req in enumerate(requests):
        if req.return_routed_experts:
            req.routed_experts.append(step[i])


def joined(capture: RoutingCapture, chunks: list[np.ndarray]) -> np.ndarray:
    """A request's record (tokens, layers, top_k) from its chunks (none: no token was read)."""
    if not chunks:
        return np.zeros((0, len(capture.routers), capture.top_k), dtype=capture.dtype)
    return np.concatenate(chunks)


def encode(record: np.ndarray) -> dict:
    """The response's meta_info fields for one request's record (tokens, layers, top_k)."""
    raw = np.ascontiguousarray(record).tobytes()
    return {"routed_experts": base64.b64encode(raw).decode("ascii"),
            "routed_experts_dtype": record.dtype.name, "routed_experts_shape": list(record.shape)}
