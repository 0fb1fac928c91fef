"""Routing statistics taken from a model's MoE routers during the training passes.

`RouterCapture.attach(model)` puts a forward hook on each MoE router of the model (transformers'
`Qwen3MoeTopKRouter`, module `mlp.gate`) and a pre-hook on the model itself that reads the
micro-batch's `attention_mask`: the routers see padded positions too, and only real tokens count.
The hooks count only in a training forward (the model in train mode with gradients on: the
optimizer steps' passes), so the log-prob and reference passes, which run the same routers, leave
them alone and each of the iteration's tokens is counted once. With rollout routing replay the
routers' output is the replayed experts (R3's hooks run first): the figures are of the routing
the step used. Sums stay on the device until `take()` (one copy to the host per iteration). A
dense model has no router: `attach` returns None and a rank pays nothing.
"""
from __future__ import annotations

import re

import torch

from miles.moe.routing_stats import LayerRouting, routing_sums

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def hf_router_class():
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    return Qwen3MoeTopKRouter


def layer_index(module_name: str) -> int:
    """The decoder layer of a router by its module name (`model.layers.3.mlp.gate` -> 3)."""
    found = _LAYER.search(module_name)
    if found is None:
        raise ValueError(f"router module {module_name!r} is not under a `layers.<n>.` module")
    return int(found.group(1))


def hf_routing(output) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs [T, E], chosen [T, k]) from a `Qwen3MoeTopKRouter`'s (logits, weights, indices)."""
    logits, _, chosen = output
    return torch.softmax(logits.detach(), dim=-1, dtype=torch.float), chosen


class RouterCapture:
    """Per-layer routing sums of one iteration's training passes on this rank."""

    def __init__(self, routers: dict[int, torch.nn.Module]):
        self.real: torch.Tensor | None = None  # set while a training forward runs: the hooks count
        self._sums: dict[int, list] = {}
        self._top_k: dict[int, int] = {}
        self.handles = [router.register_forward_hook(self._hook(layer))
                        for layer, router in sorted(routers.items())]

    @classmethod
    def attach(cls, model: torch.nn.Module) -> "RouterCapture | None":
        """Hooks on every transformers Qwen3-MoE router of `model` and on `model`'s forward, which
        starts and ends the counting of a training pass (None: a dense model)."""
        router_class = hf_router_class()
        routers = {layer_index(name): m for name, m in model.named_modules()
                   if isinstance(m, router_class)}
        if not routers:
            return None
        capture = cls(routers)
        capture.handles += [model.register_forward_pre_hook(capture._start, with_kwargs=True),
                            model.register_forward_hook(capture._end, always_call=True)]
        return capture

    def _start(self, model, args, kwargs) -> None:
        if not (model.training and torch.is_grad_enabled()):
            return  # a log-prob or reference pass
        mask = kwargs.get("attention_mask")
        if mask is None:
            raise ValueError("an MoE training forward without attention_mask: the routing "
                             "statistics cannot tell real tokens from padding")
        self.real = mask.reshape(-1).bool()

    def _end(self, model, args, output) -> None:
        self.real = None

    def _hook(self, layer: int):
        def count(module, inputs, output) -> None:
            if self.real is None:
                return
            probs, chosen = hf_routing(output)
            self.add(layer, probs, chosen)
        return count

    def add(self, layer: int, probs: torch.Tensor, chosen: torch.Tensor) -> None:
        """Count one router call of `layer` over the tokens of the micro-batch being recorded."""
        if probs.shape[0] != self.real.numel():
            raise ValueError(f"layer {layer}'s router saw {probs.shape[0]} tokens, the micro-batch "
                             f"has {self.real.numel()} positions")
        sums = routing_sums(probs, chosen, self.real.to(probs.device))
        held = self._sums.get(layer)
        self._sums[layer] = list(sums) if held is None else [a + b for a, b in zip(held, sums)]
        self._top_k[layer] = chosen.shape[-1]

    def take(self) -> dict[int, LayerRouting]:
        """The sums recorded since the last `take`, per layer, as plain numbers; starts anew."""
        out = {}
        for layer, (tokens, counts, prob_sums, entropy) in sorted(self._sums.items()):
            out[layer] = LayerRouting(self._top_k[layer], int(tokens), counts.tolist(),
                                      prob_sums.tolist(), float(entropy))
        self._sums.clear()
        return out

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
