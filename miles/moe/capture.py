"""Routing statistics taken from a model's MoE routers during the training passes.

`RouterCapture.attach(model)` puts a forward hook on each MoE router of the model (transformers'
`Qwen3MoeTopKRouter`, module `mlp.gate`; megatron-core's `TopKRouter`, module `mlp.router`) and a
pre-hook on the model itself that finds the micro-batch's real tokens: the routers see padded
positions too, and only real tokens count. The mask is the forward's `attention_mask`, or, for a
backend that calls its model without one (Megatron's schedule: the causal mask alone is exact
for right-padded rows), the mask of the micro-batch whose `input_ids` the forward got
(`expect`). The hooks count only in a training forward (the model in train mode with gradients
on: the optimizer steps' passes), so the log-prob and reference passes, which run the same
routers, leave them alone and each of the iteration's tokens is counted once. With rollout
routing replay the routers' output is the replayed experts (R3 runs first): the figures are of
the routing the step used. Sums stay on the device until `take()` (one copy to the host per
iteration). A dense model has no router: `attach` returns None and a rank pays nothing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch

from miles.moe.routing_stats import LayerRouting, routing_sums

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def layer_index(module_name: str) -> int:
    """The decoder layer of a router by its module name (`model.layers.3.mlp.gate` -> 3)."""
    found = _LAYER.search(module_name)
    if found is None:
        raise ValueError(f"router module {module_name!r} is not under a `layers.<n>.` module")
    return int(found.group(1))


def hf_routing(module, inputs, output) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs [T, E], chosen [T, k]) from a `Qwen3MoeTopKRouter`'s (logits, weights, indices)."""
    logits, _, chosen = output
    return torch.softmax(logits.detach(), dim=-1, dtype=torch.float), chosen


def megatron_routing(module, inputs, output) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs [T, E], chosen [T, k]) of a megatron-core `TopKRouter`: its output holds only the
    chosen experts' weights (and the routing map, replayed or its own), so the full distribution
    is taken again from its input, as its load-balancing loss scores the experts (softmax, or
    sigmoid normalised over the experts)."""
    _, routing_map = output
    hidden = inputs[0].detach()
    bias = None if module.bias is None else module.bias.detach().float()
    logits = torch.nn.functional.linear(hidden.float(), module.weight.detach().float(), bias)
    logits = logits.reshape(-1, logits.shape[-1])
    if module.score_function == "sigmoid":
        scores = torch.sigmoid(logits)
        probs = scores / (scores.sum(-1, keepdim=True) + 1e-20)
    else:
        probs = torch.softmax(logits, dim=-1)
    chosen = routing_map.to(torch.int8).topk(module.topk, dim=-1).indices
    return probs, chosen


@dataclass(frozen=True)
class RouterKind:
    """How to read one family of routers: their (probs, chosen) and their token order."""

    read: Callable
    seq_major: bool  # tokens laid out as (S, B) (megatron-core) rather than (B, S)


def hf_routers(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    return {layer_index(name): m for name, m in model.named_modules()
            if isinstance(m, Qwen3MoeTopKRouter)}


def megatron_routers(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """Global layer index (a pipeline stage holds some) -> megatron-core TopKRouter."""
    try:
        from megatron.core.transformer.moe.router import TopKRouter
    except ImportError:  # megatron-core not installed: no such router can exist
        return {}
    return {int(m.layer_number) - 1: m for m in model.modules()
            if isinstance(m, TopKRouter) and m.layer_number is not None}


KINDS = ((hf_routers, RouterKind(hf_routing, seq_major=False)),
         (megatron_routers, RouterKind(megatron_routing, seq_major=True)))


class RouterCapture:
    """Per-layer routing sums of one iteration's training passes on this rank."""

    def __init__(self, routers: dict[int, torch.nn.Module], kind: RouterKind):
        self.kind = kind
        self.real: torch.Tensor | None = None  # (B, S) while a training forward runs: hooks count
        self._expected: dict[int, torch.Tensor] = {}  # id(input_ids) -> its attention mask
        self._sums: dict[int, list] = {}
        self._top_k: dict[int, int] = {}
        self.handles = [router.register_forward_hook(self._hook(layer))
                        for layer, router in sorted(routers.items())]

    @classmethod
    def attach(cls, model: torch.nn.Module) -> "RouterCapture | None":
        """Hooks on every MoE router of `model` and on `model`'s forward, which starts and ends
        the counting of a training pass (None: a dense model)."""
        for find, kind in KINDS:
            routers = find(model)
            if routers:
                capture = cls(routers, kind)
                capture.handles += [
                    model.register_forward_pre_hook(capture._start, with_kwargs=True),
                    model.register_forward_hook(capture._end, always_call=True)]
                return capture
        return None

    def expect(self, micro_batches) -> None:
        """The micro-batches the next passes run: a forward given one of their `input_ids` without
        an attention mask counts that micro-batch's real tokens."""
        self._expected = {id(mb.input_ids): mb.attention_mask for mb in micro_batches}

    def _start(self, model, args, kwargs) -> None:
        if not (model.training and torch.is_grad_enabled()):
            return  # a log-prob or reference pass
        mask = kwargs.get("attention_mask")
        if mask is None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            mask = self._expected.get(id(ids))
        if mask is None:
            raise ValueError("an MoE training forward of a micro-batch the routing capture was "
                             "not given (no attention_mask, input_ids not expected): it cannot "
                             "tell real tokens from padding")
        self.real = mask.bool()

    def _end(self, model, args, output) -> None:
        self.real = None

    def _hook(self, layer: int):
        def count(module, inputs, output) -> None:
            if self.real is None:
                return
            probs, chosen = self.kind.read(module, inputs, output)
            self.add(layer, probs, chosen)
        return count

    def add(self, layer: int, probs: torch.Tensor, chosen: torch.Tensor) -> None:
        """Count one router call of `layer` over the tokens of the micro-batch being recorded."""
        real = (self.real.t() if self.kind.seq_major else self.real).reshape(-1)
        if probs.shape[0] != real.numel():
            raise ValueError(f"layer {layer}'s router saw {probs.shape[0]} tokens, the micro-batch "
                             f"has {real.numel()} positions")
        sums = routing_sums(probs, chosen, real.to(probs.device))
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
