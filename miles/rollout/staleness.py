"""Staleness of a rollout's tokens, in weight versions, when the trainer takes it (async GRPO's metrics).

A token sampled by version v and trained at version t is t - v stale. Per sample that splits into the
versions pushed while it was generated (in flight: its last token's version - its first's) and those
pushed while it waited in the buffer (in queue: t - its last token's version).
"""
from __future__ import annotations

from miles.rollout.sample import Sample


def token_versions(sample: Sample, fallback: int) -> list[int]:
    """The weight version of each response token (the request's version where the engine did not report
    them per token; `fallback` where the version is not a number, as an engine's "default")."""
    versions = sample.token_weight_versions or [sample.weight_version] * max(sample.response_length, 1)
    return [_as_int(v, fallback) for v in versions]


def _as_int(version, fallback: int) -> int:
    try:
        return int(version)
    except (TypeError, ValueError):
        return fallback


def staleness_metrics(samples: list[Sample], train_version: int) -> dict[str, float]:
    """`rollout/staleness/{mean,max}` (per token), their in-flight and in-queue parts (per sample),
    `rollout/mixed_version_ratio` (samples whose tokens span more than one version) and the mean raw
    reward by staleness (`rollout/reward_by_staleness/<k>`, a sample's staleness being its oldest token's)."""
    tokens: list[int] = []
    in_flight: list[int] = []
    in_queue: list[int] = []
    by_staleness: dict[int, list[float]] = {}
    mixed = 0
    for s in samples:
        versions = token_versions(s, train_version)
        tokens += [train_version - v for v in versions]
        in_flight.append(max(versions) - min(versions))
        in_queue.append(train_version - versions[-1])
        mixed += len(set(versions)) > 1
        by_staleness.setdefault(train_version - min(versions), []).append(float(s.raw_reward or 0.0))
    metrics = {
        "rollout/staleness/mean": sum(tokens) / len(tokens),
        "rollout/staleness/max": float(max(tokens)),
        "rollout/staleness/in_flight_mean": sum(in_flight) / len(in_flight),
        "rollout/staleness/in_flight_max": float(max(in_flight)),
        "rollout/staleness/in_queue_mean": sum(in_queue) / len(in_queue),
        "rollout/staleness/in_queue_max": float(max(in_queue)),
        "rollout/mixed_version_ratio": mixed / len(samples),
    }
    metrics.update({f"rollout/reward_by_staleness/{k}": sum(r) / len(r) for k, r in sorted(by_staleness.items())})
    return metrics
