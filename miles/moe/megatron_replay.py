"""Rollout routing replay (R3) on the Megatron backend, through megatron-core's own `RouterReplay`.

megatron-core 0.16 gives each `TopKRouter` a `RouterReplay` when `moe_enable_routing_replay` is
set: with the action `REPLAY_FORWARD` the router takes its target indices instead of its own top-k
and gathers its scores there (softmax over the k gathered logits: HF's renormalised weights, so
gradients still reach the router). The schedule runs a pass's micro-batches itself, so the records
wait in a queue: a forward pre-hook on the model takes the next micro-batch's record, and a
pre-hook on each router computes the router's own choice (the mismatch), then sets the target:
the engine's experts where it read the token, the router's own elsewhere (the last token, padding).

Pipeline parallel: each stage holds the routers of its own layers, found by their global index
(`layer_number - 1`), and takes their columns of the whole record ([tokens, all MoE layers, k]).
megatron-core's 1F1B schedule (and its forward-only pass) runs a stage's forwards in micro-batch
order, so the queue lines up on every stage; the model hook checks each micro-batch's shape against
its record all the same. Targets are set per forward (`REPLAY_FORWARD`); the backward pass reuses
the indices autograd kept. `REPLAY_BACKWARD`, which pops targets again for activation recompute, is
not used: a model configured to recompute is refused. Each stage counts the mismatches of its own
layers; `mismatch_shares` adds the counts over the pipeline group before dividing by all layers.

Megatron lays a micro-batch's tokens out sequence-major (row s * B + b of the router's logits);
the records are (B, T, layers, top_k) as the HF model's, so each is transposed once.
"""
from __future__ import annotations

from collections import deque
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.distributed as dist

from miles.moe.replay import FLAG


def megatron_routers(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """Global layer index -> that layer's megatron-core TopKRouter holding a RouterReplay."""
    found = {}
    for module in model.modules():
        router = getattr(getattr(module, "mlp", None), "router", None)
        if getattr(router, "router_replay", None) is not None and hasattr(module, "layer_number"):
            found[int(module.layer_number) - 1] = router
    return dict(sorted(found.items()))


class MegatronRoutingReplay:
    """The routers of one Megatron model (one pipeline stage's) following queued engine records,
    pass by pass; `group`: the pipeline group whose stages hold the other layers (None: PP = 1)."""

    def __init__(self, routers: dict[int, torch.nn.Module], num_layers: int, group=None):
        self.routers, self.num_layers, self.group = routers, num_layers, group
        self.replay = False
        self.queue: deque = deque()  # (B, T, layers, k) records of the micro-batches to come
        self.record: torch.Tensor | None = None  # the running micro-batch's, sequence-major
        self.counts: list[torch.Tensor] = []  # per micro-batch (B, T): own layers that differ
        self._current: torch.Tensor | None = None  # (T, B) the running micro-batch's count
        self.handles = [r.register_forward_pre_hook(self._router_hook(layer))
                        for layer, r in routers.items()]

    @classmethod
    def attach(cls, model: torch.nn.Module, num_layers: int,
               group=None) -> "MegatronRoutingReplay | None":
        from megatron.core.transformer.moe.router_replay import RouterReplay

        routers = megatron_routers(model)
        # megatron-core also lists every instance in a class-wide list (its static helpers, unused
        # here): emptied, so models rebuilt by load_base are not held there
        RouterReplay.clear_global_router_replay_instances()
        if not routers:
            return None
        if getattr(model.config, "recompute_granularity", None) is not None:
            raise ValueError(f"{FLAG}: the model recomputes activations "
                             f"({model.config.recompute_granularity}), whose second router pass "
                             "replay does not follow")
        replay = cls(routers, num_layers, group)
        replay.handles.append(model.register_forward_pre_hook(replay._next_micro_batch))
        return replay

    @contextmanager
    def passing(self, records: list[torch.Tensor], replay: bool) -> Iterator[None]:
        """The micro-batches of one schedule pass, in order: each model forward takes the next
        record."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        for record in records:
            if record.shape[2] != self.num_layers:
                raise ValueError(f"the routing record holds {record.shape[2]} MoE layers, the "
                                 f"model {self.num_layers}: was it made by another model?")
        self.queue, self.replay, self.counts = deque(records), replay, []
        action = RouterReplayAction.REPLAY_FORWARD if replay else None
        for router in self.routers.values():
            router.router_replay.clear_indices()
            router.router_replay.set_router_replay_action(action)
        try:
            yield
            if self.queue:
                raise RuntimeError(f"routing replay: the schedule ran "
                                   f"{len(records) - len(self.queue)} of this pass's "
                                   f"{len(records)} micro-batches")
        finally:
            self._close_micro_batch()
            self.queue.clear()
            for router in self.routers.values():
                router.router_replay.clear_indices()
                router.router_replay.clear_router_replay_action()

    def mismatch_shares(self) -> list[torch.Tensor]:
        """Per micro-batch of the last pass, (B, T): the share of all MoE layers whose router chose
        other experts than the record. Collective over the pipeline group at PP > 1 (its stages'
        counts added), so every stage gets PP = 1's numbers."""
        if not self.counts:
            return []
        flat = torch.cat([c.reshape(-1) for c in self.counts]).to(torch.float64)
        if self.group is not None:
            dist.all_reduce(flat, group=self.group)
        shares = (flat / self.num_layers).to(torch.float32).split([c.numel() for c in self.counts])
        return [s.reshape(c.shape) for s, c in zip(shares, self.counts)]

    def _next_micro_batch(self, _module, args) -> None:
        if not self.queue:
            return
        self._close_micro_batch()
        record = self.queue.popleft()  # (B, T, L, k) -> (T * B, L, k): Megatron's token order
        if tuple(args[0].shape) != tuple(record.shape[:2]):
            raise RuntimeError(f"routing replay out of step with the schedule: a micro-batch of "
                               f"{tuple(args[0].shape)} tokens met a record for "
                               f"{tuple(record.shape[:2])}")
        self.record = record.transpose(0, 1).reshape(-1, *record.shape[2:])
        self._current = torch.zeros((record.shape[1], record.shape[0]), dtype=torch.int32)

    def _close_micro_batch(self) -> None:
        if self._current is not None:  # (T, B) -> (B, T)
            self.counts.append(self._current.transpose(0, 1))
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
        self._current += differs.reshape(self._current.shape).cpu().to(self._current.dtype)
        if self.replay:
            router.router_replay.clear_indices()
            router.router_replay.set_target_indices(torch.where(known[:, None], engine, own))

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
