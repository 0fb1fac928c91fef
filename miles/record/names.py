"""Metric keys valid for every tracker, and the step axis each namespace is plotted on.

MLflow accepts only letters, digits and `_ - . / : space` in metric names, wandb and
TensorBoard accept more; so one mapping is applied once, before the journal, and every
tracker receives the same mapped keys: `@` becomes `_at_` (`passrate/pass@4` ->
`passrate/pass_at_4`), any other character outside that set becomes `_`.
"""
from __future__ import annotations

import re

STEP_KEYS = ("train/step", "rollout/step", "eval/step")
_INVALID = re.compile(r"[^A-Za-z0-9_\-./: ]")


def metric_key(name: str) -> str:
    """The tracker-safe form of a metric name (idempotent)."""
    return _INVALID.sub("_", name.replace("@", "_at_"))


def map_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Mapped keys, float values; two names that map to one key are an error, not a silent overwrite."""
    out: dict[str, float] = {}
    origin: dict[str, str] = {}
    for name, value in metrics.items():
        key = metric_key(name)
        if key in out:
            raise ValueError(f"metric names {origin[key]!r} and {name!r} both map to the tracker-safe key {key!r}")
        out[key], origin[key] = float(value), name
    return out


def step_key(key: str) -> str:
    """The step counter a metric is plotted against: `train/*` on train/step, `eval/*` on
    eval/step, everything else (rollout/, perf/, multi_turn/, passrate/) on rollout/step."""
    namespace = key.split("/", 1)[0]
    return {"train": "train/step", "eval": "eval/step"}.get(namespace, "rollout/step")


def step_of(key: str, line: dict[str, float], rollout_id: int) -> int:
    """The step of `key` in one journal line (the rollout id when the line lacks the counter)."""
    return int(line.get(step_key(key), rollout_id))
