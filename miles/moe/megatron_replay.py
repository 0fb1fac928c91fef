"""Rollout routing replay (R3) on the Megatron backend, through megatron-core's own `RouterReplay`.

megatron-core 0.16 gives each `TopKRouter` a `RouterReplay` when `moe_enable_routing_replay` is
set: with the action `REPLAY_FORWARD` the router takes its target indices instead of its own top-k
and gathers its scores there (softmax over the k gathered logits: HF's renormalised weights, so
gradients still reach the router). The schedule runs a pass's micro-batches itself, so the records
wait in a queue: a forward pre-hook on the model takes the next micro-batch's record, and a
pre-hook on each router computes the router's own choice (the mismatch), then sets the target:
the engine's experts where it read the token, the router's own elsewhere (the last token, padding).

Megatron lays a micro-batch's tokens out sequence-major (row s * B + b of the router's logits);
the records are (B, T, layers, top_k) as the HF model's, so each is transposed once. One pipeline
stage holds all layers here: pipeline parallel replay is refused (config/replay_flags.py).
"""
from __future__ import annotations

from collections import deque
from contextlib import contextmanager
from typing import Iterator

import torch


def megatron_routers(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """Global layer index -> that layer's megatron-core TopKRouter holding a RouterReplay."""
    found = {}
    for module in model.modules():
        router = getattr(getattr(module, "mlp", None), "router", None)
        if getattr(router, "router_replay", None) is not None and hasattr(module, "layer_number"):
            found[int(module.layer_number) - 1] = router
    return dict(sorted(found.items()))


class MegatronRoutingReplay:
    """The routers of one Megatron model following queued engine records, pass by pass."""

    def __init__(self, routers: dict[int, torch.nn.Module], num_layers: int):
        self.routers, self.num_layers = routers, num_layers
        self.replay = False
        self.queue: deque = deque()  # (B, T, layers, k) records of the micro-batches to come
        self.record: torch.Tensor | None = None  # the running micro-batch's, sequence-major
        self.mismatches: list[torch.Tensor] = []  # per micro-batch (B, T) share of layers
        self._current: torch.Tensor | None = None
        self.handles = [r.register_forward_pre_hook(self._router_hook(layer))
                        for layer, r in routers.items()]

    @classmethod
    def attach(cls, model: torch.nn.Module, num_layers: int) -> "MegatronRoutingReplay | None":
        from megatron.core.transformer.moe.router_replay import RouterReplay

        routers = megatron_routers(model)
        # megatron-core also lists every instance in a class-wide list (its static helpers, unused
        # here): emptied, so models rebuilt by load_base are not held there
        RouterReplay.clear_global_router_replay_instances()
        if not routers:
            return None
        replay = cls(routers, num_layers)
        replay.handles.append(model.register_forward_pre_hook(replay._next_micro_batch))
        return replay

    @contextmanager
    def passing(self, records: list[torch.Tensor], replay: bool) -> Iterator[None]:
        """The micro-batches of one schedule pass, in order: each model forward takes the next
        record."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        self.queue, self.replay, self.mismatches = deque(records), replay, []
        action = RouterReplayAction.REPLAY_FORWARD if replay else None
        for router in self.routers.values():
            router.router_replay.clear_indices()
            router.router_replay.set_router_replay_action(action)
        try:
            yield
        finally:
            self._close_micro_batch()
            self.queue.clear()
            for router in self.routers.values():
                router.router_replay.clear_indices()
                router.router_replay.clear_router_replay_action()

    def _next_micro_batch(self, _module, _args) -> None:
        if not self.queue:
            return
        self._close_micro_batch()
        record = self.queue.popleft()  # (B, T, L, k) -> (T * B, L, k): Megatron's token order
        self.record = record.transpose(0, 1).reshape(-1, *record.shape[2:])
        self._current = torch.zeros((record.shape[1], record.shape[0], self.num_layers),
                                    dtype=torch.bool)

    def _close_micro_batch(self) -> None:
        if self._current is not None:  # (T, B, L) -> (B, T) share of layers that chose otherwise
            self.mismatches.append(self._current.float().mean(dim=-1).transpose(0, 1))
        self._current = self.record = None

    def _router_hook(self, layer: int):
        def follow(router, args) -> None:
            if self.record is not None:
                self._follow(router, layer, args[0])
        return follow

    @torch.no_grad()
    def _follow(self, router, layer: int, hidden: torch.Tensor) -> None:
        logits = router.gating(hidden).reshape(-1, router.config.num_moe_experts)
        own = torch.topk(logits, k=router.topk, dim=-1).indices  # top-k of logits = of softmax
        engine = self.record[:, layer].to(device=own.device, dtype=own.dtype)
        known = (engine >= 0).all(dim=-1)
        differs = (own.sort(-1).values != engine.sort(-1).values).any(-1) & known
        self._current[:, :, layer] = differs.reshape(self._current.shape[:2]).cpu()
        if self.replay:
            router.router_replay.clear_indices()
            router.router_replay.set_target_indices(torch.where(known[:, None], engine, own))

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
