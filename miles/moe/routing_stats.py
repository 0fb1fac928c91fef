"""A mixture-of-experts router's statistics over one iteration, per layer.

What one MoE layer's router did on the real (unpadded) tokens of a training pass is kept as sums
(`LayerRouting`): tokens seen, top-k picks per expert, router probability per expert and the
router's entropy. Sums add up over micro-batches and data-parallel ranks (counts, never ratios:
two ranks' imbalances do not average to the iteration's), and the figures are taken from the
sums once per iteration (`routing_metrics`):

- load_balancing_loss: E * sum_i f_i * P_i (Switch Transformer; megatron-core's
  `switch_load_balancing_loss_func` without the coefficient), f_i the share of the T * k top-k
  picks that went to expert i and P_i its mean router probability. 1.0 when the router spreads
  tokens and probability evenly, E / k when every token goes to the same k experts. (transformers'
  `load_balancing_loss_func` counts f_i over T, not T * k: k times this.) Here over the whole
  iteration's tokens, as megatron's global-batch variant.
- tokens_per_expert_{max,min} and expert_imbalance (max / mean tokens per expert: 1.0 balanced).
- max_expert_share: the share of tokens routed to the busiest expert (busiest_expert), k / E when
  balanced, 1.0 when every token goes to it.
- dead_experts: experts no token was routed to in the iteration.
- router_entropy: the mean over tokens of the entropy of the router's distribution over experts,
  in nats (log E at most: uniform; 0: one expert takes all of the probability).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

PREFIX = "moe/"  # megatron-core logs per-layer router figures as moe/<name>_layer_<i>
LAYER_FIGURES = ("load_balancing_loss", "tokens_per_expert_max", "tokens_per_expert_min",
                 "expert_imbalance", "max_expert_share", "busiest_expert", "dead_experts",
                 "router_entropy")


@dataclass
class LayerRouting:
    """One MoE layer's routing sums over some tokens (a micro-batch, an iteration, all ranks)."""

    top_k: int
    tokens: int  # real tokens routed
    counts: list[int]  # top-k picks per expert (they sum to tokens * top_k)
    prob_sums: list[float]  # the router's probability per expert, summed over tokens
    entropy_sum: float  # the router distribution's entropy (nats), summed over tokens

    @property
    def num_experts(self) -> int:
        return len(self.counts)

    def __add__(self, other: "LayerRouting") -> "LayerRouting":
        if (self.top_k, self.num_experts) != (other.top_k, other.num_experts):
            raise ValueError(f"cannot add the routing of top-{other.top_k} over "
                             f"{other.num_experts} experts to top-{self.top_k} over "
                             f"{self.num_experts} experts")
        return LayerRouting(self.top_k, self.tokens + other.tokens,
                            [a + b for a, b in zip(self.counts, other.counts)],
                            [a + b for a, b in zip(self.prob_sums, other.prob_sums)],
                            self.entropy_sum + other.entropy_sum)


def routing_sums(probs: torch.Tensor, chosen: torch.Tensor, real: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens, counts [E], prob sums [E], entropy sum) as tensors on the router's device (no
    host sync: a capture adds them up over micro-batches). `probs` [T, E]: the router's full
    distribution; `chosen` [T, k]: the experts picked; `real` [T]: True on real tokens."""
    probs = probs.detach().double()
    chosen = chosen.detach()
    if real is not None:
        real = real.reshape(-1).bool()
        probs, chosen = probs[real], chosen[real]
    counts = torch.bincount(chosen.reshape(-1), minlength=probs.shape[-1])
    entropy = -torch.special.xlogy(probs, probs).sum()
    return torch.tensor(probs.shape[0]), counts, probs.sum(0), entropy


def layer_routing(probs: torch.Tensor, chosen: torch.Tensor, real: torch.Tensor | None = None
                  ) -> LayerRouting:
    """The sums of one layer's routing of a batch of tokens (see `routing_sums`)."""
    tokens, counts, prob_sums, entropy = routing_sums(probs, chosen, real)
    return LayerRouting(chosen.shape[-1], int(tokens), counts.tolist(), prob_sums.tolist(),
                        float(entropy))


def load_balancing_loss(r: LayerRouting) -> float:
    """E * sum_i f_i * P_i over the tokens of `r` (0.0 with no tokens)."""
    if r.tokens == 0:
        return 0.0
    picks = r.tokens * r.top_k
    return r.num_experts * sum(c / picks * p / r.tokens for c, p in zip(r.counts, r.prob_sums))


def layer_figures(r: LayerRouting) -> dict[str, float]:
    """LAYER_FIGURES of one layer's iteration."""
    mean = r.tokens * r.top_k / r.num_experts
    busiest = max(range(r.num_experts), key=lambda e: r.counts[e])
    return {
        "load_balancing_loss": load_balancing_loss(r),
        "tokens_per_expert_max": float(r.counts[busiest]),
        "tokens_per_expert_min": float(min(r.counts)),
        "expert_imbalance": r.counts[busiest] / mean if mean else 0.0,
        "max_expert_share": r.counts[busiest] / r.tokens if r.tokens else 0.0,
        "busiest_expert": float(busiest),
        "dead_experts": float(sum(1 for c in r.counts if c == 0)),
        "router_entropy": r.entropy_sum / r.tokens if r.tokens else 0.0,
    }


def routing_metrics(layers: dict[int, LayerRouting]) -> dict[str, float]:
    """`moe/<figure>_layer_<l>` per MoE layer and the across-layer summary: load_balancing_loss
    and router_entropy averaged over layers (megatron's summary of the aux loss), expert_imbalance
    and max_expert_share the worst layer's, dead_experts summed, routed_tokens per layer. {} for a
    dense model (no layers)."""
    if not layers:
        return {}
    per_layer = {layer: layer_figures(r) for layer, r in sorted(layers.items())}
    out = {f"{PREFIX}{name}_layer_{layer}": value
           for layer, figures in per_layer.items() for name, value in figures.items()}
    n = len(per_layer)
    column = {name: [f[name] for f in per_layer.values()] for name in LAYER_FIGURES}
    out.update({
        f"{PREFIX}load_balancing_loss": math.fsum(column["load_balancing_loss"]) / n,
        f"{PREFIX}router_entropy": math.fsum(column["router_entropy"]) / n,
        f"{PREFIX}expert_imbalance": max(column["expert_imbalance"]),
        f"{PREFIX}max_expert_share": max(column["max_expert_share"]),
        f"{PREFIX}dead_experts": sum(column["dead_experts"]),
        f"{PREFIX}routed_tokens": float(max(r.tokens for r in layers.values())),
    })
    return out


def merge_ranks(per_rank: list[dict[int, LayerRouting] | None]) -> dict[int, LayerRouting]:
    """The iteration's routing over data-parallel ranks: each layer's sums added (a rank without
    routing, a dense model's, adds nothing)."""
    out: dict[int, LayerRouting] = {}
    for layers in per_rank:
        for layer, r in (layers or {}).items():
            out[layer] = out[layer] + r if layer in out else r
    return out


def rank_routing_metrics(results) -> dict[str, float]:
    """The iteration's `moe/*` figures from the training ranks' results (their `routing`: layer ->
    LayerRouting of the tokens that rank routed, {} on a dense model). A rank whose routing
    repeats another's (a tensor-parallel peer that routes the same tokens) reports none."""
    return routing_metrics(merge_ranks([getattr(r, "routing", None) for r in results]))
