"""Rollout routing replay (R3) in the trainer's passes over the HF model, and how often it matters.

An MoE router picks each token's experts from its logits; the engine picked them under its own
weights and arithmetic (another dtype, weights a version behind in async training), so the
trainer's own choice can differ and the train and rollout log-probs disagree however exact the
weights are. With replay, each transformers `Qwen3MoeTopKRouter` (module `mlp.gate`) uses the
experts the engine recorded for the token; their weights are the trainer's softmax
probabilities gathered at those experts and renormalised as the router does, so the router
still gets gradients. A token the engine read none of (the last one, padding) keeps the
trainer's own choice.

Whether it replays or not, every pass that follows a record notes, per token and layer, whether
the trainer's own router would have chosen another set of experts: `train/r3_mismatch_fraction`.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

FLAG = "--use-rollout-routing-replay"
METRIC = "train/r3_mismatch_fraction"


def hf_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """`model`'s transformers Qwen3-MoE routers in layer order (empty: a dense model)."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    return [m for m in model.modules() if isinstance(m, Qwen3MoeTopKRouter)]


class RoutingReplay:
    """Forward hooks on one model's routers that follow an engine record while `following` runs."""

    def __init__(self, routers: list[torch.nn.Module]):
        self.routers = routers
        self.record: torch.Tensor | None = None  # (B*T, layers, top_k), -1: no engine choice
        self.replay = False
        self.mismatch: torch.Tensor | None = None  # (B*T, layers) the own set differs
        # before any other hook of the router, so routing statistics count the experts used
        self.handles = [r.register_forward_hook(self._hook(i), prepend=True)
                        for i, r in enumerate(routers)]

    @classmethod
    def attach(cls, model: torch.nn.Module) -> "RoutingReplay | None":
        routers = hf_routers(model)
        return cls(routers) if routers else None

    @contextmanager
    def following(self, record: torch.Tensor, replay: bool) -> Iterator[None]:
        """Passes in this block compare with (and, with `replay`, use) `record`, (B, T, layers,
        top_k) laid out as the routers flatten tokens (batch-major)."""
        if record.shape[2] != len(self.routers):
            raise ValueError(f"the routing record holds {record.shape[2]} MoE layers, the model "
                             f"{len(self.routers)}: was it made by another model?")
        self.record, self.replay = record.reshape(-1, *record.shape[2:]), replay
        self.mismatch = torch.zeros(self.record.shape[:2], dtype=torch.bool, device=record.device)
        try:
            yield
        finally:
            self.record = None

    def _hook(self, layer: int):
        def follow(module, inputs, output):
            if self.record is None:
                return None
            return self._follow(module, layer, *output)
        return follow

    def _follow(self, module, layer: int, logits, weights, own):
        engine = self.record[:, layer].to(device=own.device, dtype=own.dtype)  # int8/16 -> indices
        known = (engine >= 0).all(dim=-1)
        differs = (own.sort(dim=-1).values != engine.sort(dim=-1).values).any(dim=-1)
        self.mismatch[:, layer] = (known & differs).to(self.mismatch.device)
        if not self.replay:
            return None
        chosen = torch.where(known[:, None], engine, own)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        replayed = probs.gather(-1, chosen)
        if getattr(module, "norm_topk_prob", True):
            replayed = replayed / replayed.sum(dim=-1, keepdim=True)
        replayed = torch.where(known[:, None], replayed.to(weights.dtype), weights)
        return logits, replayed, chosen

    def mismatch_fraction(self, batch: int) -> torch.Tensor:
        """(B, T) the share of MoE layers where the trainer's own experts differed, per token, in
        the last pass in `following`."""
        return self.mismatch.reshape(batch, -1, self.mismatch.shape[-1]).float().mean(dim=-1)

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def require_routers(replay: RoutingReplay | None, wanted: bool, model_path) -> None:
    """The flag on a model without expert routers: a clear error, not a run that replays nothing."""
    if wanted and replay is None:
        raise ValueError(f"{FLAG}: the policy {model_path} has no mixture-of-experts routers "
                         f"(transformers Qwen3-MoE `mlp.gate`); replay needs an MoE model")


def require_records(wanted: bool, has_routers: bool, has_records: bool) -> None:
    """The flag on an MoE policy whose samples came without the engine's routing: refused, rather
    than trained on the trainer's own routing while the run claims replay."""
    if wanted and has_routers and not has_records:
        raise ValueError(f"{FLAG}: the rollout's samples carry no routed experts (the engine did "
                         f"not return them: SGLang needs --enable-return-routed-experts, e.g. in "
                         f"--sglang-extra-args; a custom generate function must fill "
                         f"Sample.routed_experts for every sample)")
