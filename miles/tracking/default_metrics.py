"""Miles' default rollout and eval metrics, computed from the samples when no custom logger
replaces them (names as Miles' rollout logger emits them)."""
from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def rollout_metrics(samples: list, extra_metrics: dict | None, rollout_time: float) -> dict[str, float]:
    """`rollout/*` from the samples, the caller's extra metrics and `perf/rollout_time`."""
    out: dict[str, float] = dict(extra_metrics or {})
    out["perf/rollout_time"] = float(rollout_time)
    if not samples:
        return out
    lengths = [s.response_length for s in samples]
    out.update({
        "rollout/response_len/mean": _mean(lengths),
        "rollout/response_len/median": float(statistics.median(lengths)),
        "rollout/response_len/max": float(max(lengths)),
        "rollout/response_len/min": float(min(lengths)),
        "rollout/truncated_ratio": _mean([1.0 if s.truncated else 0.0 for s in samples]),
    })
    raw = [s.raw_reward for s in samples if s.raw_reward is not None]
    if raw:
        out["rollout/raw_reward"] = _mean(raw)
    out.update(zero_std_counts(samples))
    return out


def zero_std_counts(samples: list) -> dict[str, float]:
    """`rollout/zero_std/count_<reward>`: GRPO groups whose rewards are all equal (no signal)."""
    groups: dict[int, list[float]] = defaultdict(list)
    for s in samples:
        if s.reward is not None:
            groups[s.group_index].append(s.reward)
    counts: dict[str, float] = defaultdict(float)
    for rewards in groups.values():
        if len(rewards) > 1 and max(rewards) == min(rewards):
            counts[f"rollout/zero_std/count_{rewards[0]:g}"] += 1
    return dict(counts)


def eval_metrics(data: dict[str, Any], extra_metrics: dict | None) -> dict[str, float]:
    """Per eval set: `eval/<name>` (mean reward), `eval/<name>-truncated_ratio`,
    `eval/<name>/response_len/mean` when samples are given."""
    out: dict[str, float] = dict(extra_metrics or {})
    for name, result in data.items():
        rewards = result.get("rewards") or []
        if rewards:
            out[f"eval/{name}"] = _mean([float(r) for r in rewards])
        if result.get("truncated"):
            out[f"eval/{name}-truncated_ratio"] = _mean([1.0 if t else 0.0 for t in result["truncated"]])
        if result.get("samples"):
            out[f"eval/{name}/response_len/mean"] = _mean([s.response_length for s in result["samples"]])
    return out
