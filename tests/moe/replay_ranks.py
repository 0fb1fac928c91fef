"""Megatron ranks (Ray actors, any layout) that report the experts their routers used: R3's tests
at PP > 1 read each stage's routing from the process that ran it. Each replaying pass (log-prob,
reference, training step) is kept with the records of its micro-batches, in schedule order, and
every router call of it as (global layer, sorted (B*T, k) experts in the records' batch-major
token order)."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator
from unittest import mock

from miles.backends.megatron.actor import MegatronTrainActor


class RouterWatchingRank(MegatronTrainActor):
    def train_watched(self, config, model_path: str, batch):
        """`batch` trained under `config` from the base weights: (result, passes), each pass a
        dict of `model` ("policy" or "reference"), `records` and `calls`."""
        self.config = config
        self.load_base(model_path)
        self.passes: list[dict] = []
        self._calls: list = []
        handles = [router.register_forward_hook(self._keep(layer))
                   for replay in self.replays.values()
                   for layer, router in replay.routers.items()]
        try:
            return self.train(batch), self.passes
        finally:
            for handle in handles:
                handle.remove()

    @contextmanager
    def replaying_pass(self, model, mbs) -> Iterator[None]:
        self._calls = []
        self.passes.append(dict(model="policy" if model is self.model else "reference",
                                records=[mb.routed_experts for mb in mbs], calls=self._calls))
        with super().replaying_pass(model, mbs):
            yield

    def _keep(self, layer: int):
        def keep(module, inputs, output):  # inputs[0] (T, B, H); output (probs, routing_map)
            t, b = inputs[0].shape[:2]
            k = int(output[1][0].sum())
            chosen = output[1].float().topk(k, dim=-1).indices.sort(-1).values
            self._calls.append((layer, chosen.reshape(t, b, k).transpose(0, 1).reshape(t * b, k)))
        return keep


def watching_ranks():
    """While open, an ActorGroup of the megatron backend starts RouterWatchingRanks."""
    return mock.patch("miles.backends.group.actor_class", lambda backend: RouterWatchingRank)


def strays(passes: list[dict]) -> tuple[int, int]:
    """(tokens the engine read whose experts differ from its record, tokens the engine read),
    over every router call of `passes`, each call matched to its micro-batch's record."""
    stray = read = 0
    for p in passes:
        layers = sorted({layer for layer, _ in p["calls"]})
        assert len(p["calls"]) == len(p["records"]) * len(layers), "a router call went missing"
        for n, (layer, used) in enumerate(p["calls"]):
            record = p["records"][n // len(layers)]
            assert layer == layers[n % len(layers)], "the calls are out of layer order"
            engine = record[:, :, layer].reshape(-1, record.shape[-1]).long().sort(-1).values
            known = (engine >= 0).all(-1)
            stray += int((used[known] != engine[known]).any(-1).sum())
            read += int(known.sum())
    return stray, read

