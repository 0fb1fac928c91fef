"""The routing panel of a mixture-of-experts run: each MoE layer's busiest expert, per rollout.

It reads the journal's per-layer routing figures (`miles.moe.routing_stats`: `moe/*_layer_<l>`)
and the health watch's `router_collapse` verdicts. Per layer and rollout: the busiest expert, its
share of the layer's tokens, the share it would have if the router were balanced (k / E, from
share / imbalance), and the dead experts; the page colours a cell from balanced (white) to every
token on one expert (red), so a layer drifting towards collapse shows as a row turning red. A
dense run's journal holds none of these keys: the panel is not available there.
"""
from __future__ import annotations

import re
from typing import Any

SHARE = re.compile(r"^moe/max_expert_share_layer_(\d+)$")
DEFAULT_BOUND = 0.95  # --health-router-max-share's default, for a run dir without its config


def _layers(rows: list[dict[str, Any]]) -> list[int]:
    return sorted({int(m.group(1)) for row in rows for k in row if (m := SHARE.match(k))})


def _cell(row: dict[str, Any], layer: int) -> dict[str, float] | None:
    share = row.get(f"moe/max_expert_share_layer_{layer}")
    if share is None:
        return None
    imbalance = row.get(f"moe/expert_imbalance_layer_{layer}")
    return {"share": share, "expert": row.get(f"moe/busiest_expert_layer_{layer}"),
            "dead": row.get(f"moe/dead_experts_layer_{layer}", 0.0),
            "balanced": share / imbalance if imbalance else None,
            "loss": row.get(f"moe/load_balancing_loss_layer_{layer}")}


def _bound(config: dict[str, Any]) -> float:
    value = config.get("health.health_router_max_share", config.get("health_router_max_share"))
    try:
        return float(value) if value is not None else DEFAULT_BOUND
    except (TypeError, ValueError):
        return DEFAULT_BOUND


def routing_view(journal: list[dict[str, Any]], verdicts: list[dict[str, Any]],
                 config: dict[str, Any]) -> dict[str, Any]:
    """`layers`, `rollouts` (those with routing figures), `cells[layer][rollout]` (share, expert,
    dead, balanced, loss; None where a rollout lacks the layer), the health `bound`, the rollouts
    the watch flagged red (`flagged`) and the `worst` cell of the run;
    `available` false without routing figures."""
    rows = [row for row in journal if any(SHARE.match(k) for k in row)]
    layers = _layers(rows)
    flagged = [v for v in verdicts if v.get("signal") == "router_collapse"
               and v.get("severity") == "red"]
    out = {"available": bool(layers), "layers": layers, "bound": _bound(config),
           "rollouts": [row["rollout_id"] for row in rows],
           "cells": [[_cell(row, layer) for row in rows] for layer in layers],
           "flagged": sorted({v["rollout_id"] for v in flagged if "rollout_id" in v}),
           "worst": None}
    seen = [(c["share"], layer, out["rollouts"][j], c)
            for i, layer in enumerate(layers) for j, c in enumerate(out["cells"][i]) if c]
    if seen:
        share, layer, rollout_id, cell = max(seen, key=lambda t: t[0])
        out["worst"] = {"layer": layer, "rollout_id": rollout_id, **cell}
    return out
