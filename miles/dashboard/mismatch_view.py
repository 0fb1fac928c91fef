"""The mismatch-by-position panel: where in the response the train-vs-rollout mismatch sits.

It reads the journal's per-position figures (`miles.backends.mismatch`:
`train/mismatch_pos/{k3,abs_diff,tokens}/<lo>-<hi>`, response-token positions in power-of-two
buckets) and lays them out as rollout x bucket cells: the bucket's token-mean k3 estimate of
KL(rollout || train), its mean |log p_train - log p_rollout| and its share of the rollout's
response tokens. The page colours a cell from none (white) to the run's largest k3 (red), so a
mismatch that grows along the response (long-context numerics, a stale KV cache) shows as a
row reddening to the right. A journal without these keys (written before them): not available.
"""
from __future__ import annotations

import re
from typing import Any

POSITION = re.compile(r"^train/mismatch_pos/k3/(\d+)-(\d+|inf)$")


def _buckets(rows: list[dict[str, Any]]) -> list[str]:
    seen = {m.group(0).rsplit("/", 1)[1]: int(m.group(1)) for row in rows for k in row
            if (m := POSITION.match(k))}
    return sorted(seen, key=seen.get)


def _cell(row: dict[str, Any], bucket: str) -> dict[str, float] | None:
    k3 = row.get(f"train/mismatch_pos/k3/{bucket}")
    if k3 is None:
        return None
    return {"k3": k3, "abs_diff": row.get(f"train/mismatch_pos/abs_diff/{bucket}"),
            "tokens": row.get(f"train/mismatch_pos/tokens/{bucket}")}


def mismatch_view(journal: list[dict[str, Any]]) -> dict[str, Any]:
    """`buckets` (`lo-hi` response positions), `rollouts` (those with the figures),
    `cells[rollout][bucket]` (k3, abs_diff, tokens; None where a rollout had no such token),
    each rollout's whole-response `k3` and `ratio_p99`, the `worst` cell by k3 and the `max` k3;
    `available` false without the figures."""
    rows = [row for row in journal if any(POSITION.match(k) for k in row)]
    buckets = _buckets(rows)
    cells = [[_cell(row, b) for b in buckets] for row in rows]
    out = {"available": bool(buckets), "buckets": buckets,
           "rollouts": [row.get("rollout_id") for row in rows], "cells": cells,
           "k3": [row.get("train/mismatch_k3") for row in rows],
           "ratio_p99": [row.get("train/mismatch_ratio_p99") for row in rows],
           "worst": None, "max": 0.0}
    seen = [(c["k3"], out["rollouts"][i], buckets[j])
            for i, row in enumerate(cells) for j, c in enumerate(row) if c]
    if seen:
        k3, rollout_id, bucket = max(seen, key=lambda t: t[0])
        out["worst"] = {"k3": k3, "rollout_id": rollout_id, "bucket": bucket}
        out["max"] = k3
    return out
