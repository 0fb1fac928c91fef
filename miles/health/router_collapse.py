"""The router collapse signal: a mixture-of-experts router sending (nearly) every token to one
expert, or letting experts die, rollout after rollout.

It reads the trainer's per-layer routing figures (`miles.moe.routing_stats`: `moe/*_layer_<l>`).
Two ways a layer collapses, each a red flag:
- one expert takes more than --health-router-max-share of the layer's tokens (its share is k / E
  when the router is balanced, 1.0 when every token goes to it) for --health-router-collapse-window
  rollouts in a row, the same expert each time;
- dead experts growing: the layer has more experts that no token reached than it had before the
  window, in each of the window's rollouts (one rollout that missed an expert is not a death;
  experts dead from the start are not growth).
A dense model logs no `moe/*` keys: the signal is off there.
"""
from __future__ import annotations

import re
from typing import Sequence

from miles.config.health import HealthConfig
from miles.health.signals import RED, Verdict

SHARE, BUSIEST = "moe/max_expert_share_layer_", "moe/busiest_expert_layer_"
DEAD = "moe/dead_experts_layer_"
_LAYER = re.compile(re.escape(SHARE) + r"(\d+)$")


def layers(metrics: dict[str, float]) -> list[int]:
    """The MoE layers a rollout's metrics hold routing figures for."""
    return sorted(int(m.group(1)) for k in metrics if (m := _LAYER.match(k)))


def stuck_expert(window: Sequence, layer: int, bound: float) -> int | None:
    """The expert that took more than `bound` of `layer`'s tokens in every rollout of `window`."""
    share, busiest = f"{SHARE}{layer}", f"{BUSIEST}{layer}"
    if not all(r.metrics.get(share, 0.0) > bound for r in window):
        return None
    experts = {r.metrics.get(busiest) for r in window}
    return int(experts.pop()) if len(experts) == 1 and None not in experts else None


def dead_grew(before, window: Sequence, layer: int) -> bool:
    """More dead experts in `layer` in each rollout of `window` than in the rollout `before` it."""
    key = f"{DEAD}{layer}"
    counts = [r.metrics.get(key) for r in window]
    start = before.metrics.get(key)
    return start is not None and None not in counts and min(counts) > start


def check_router_collapse(history: Sequence, cfg: HealthConfig, run) -> Verdict | None:
    """Red when a layer's busiest expert held more than the bound, or its dead experts grew, over
    the last --health-router-collapse-window rollouts (every such layer named)."""
    w = cfg.health_router_collapse_window
    if len(history) < w:
        return None
    window, now = history[-w:], history[-1].metrics
    before = history[-w - 1] if len(history) > w else None
    parts, values = [], {}
    for layer in layers(now):
        expert = stuck_expert(window, layer, cfg.health_router_max_share)
        if expert is not None:
            share = now[f"{SHARE}{layer}"]
            parts.append(f"layer {layer}: expert {expert} took {share:.1%} of the tokens for {w} "
                         f"rollouts in a row (bound {cfg.health_router_max_share:.0%})")
            values.update({f"{SHARE}{layer}": share, f"{BUSIEST}{layer}": float(expert)})
        if before is not None and dead_grew(before, window, layer):
            was, dead = before.metrics[f"{DEAD}{layer}"], now[f"{DEAD}{layer}"]
            parts.append(f"layer {layer}: dead experts {was:.0f} -> {dead:.0f} (no token in each "
                         f"of the last {w} rollouts)")
            values[f"{DEAD}{layer}"] = dead
    if not parts:
        return None
    return Verdict(history[-1].rollout_id, "router_collapse", RED, "; ".join(parts), values)


def evidence(rollouts: Sequence) -> str | None:
    """What an "ok" row was judged on: the largest expert share of the run and where, and the
    most dead experts of a layer; None when no rollout holds routing figures."""
    seen = [(r.metrics[f"{SHARE}{layer}"], layer, r.rollout_id)
            for r in rollouts for layer in layers(r.metrics)]
    if not seen:
        return None
    share, layer, rollout_id = max(seen)
    dead = max(r.metrics.get(f"{DEAD}{layer}", 0.0)
               for r in rollouts for layer in layers(r.metrics))
    count = len({layer for _, layer, _ in seen})
    return (f"expert share at most {share:.3g} (layer {layer}, rollout {rollout_id}), dead "
            f"experts at most {dead:.0f} per layer, over {count} MoE layers")
