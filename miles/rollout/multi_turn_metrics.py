"""The `multi_turn/` metrics of a rollout of multi-turn samples (none for single-turn rollouts)."""
from __future__ import annotations

from collections import defaultdict

from miles.rollout.sample import Sample


def _spread(name: str, values: list[float]) -> dict[str, float]:
    return {f"multi_turn/{name}_mean": sum(values) / len(values), f"multi_turn/{name}_max": float(max(values)),
            f"multi_turn/{name}_min": float(min(values))}


def multi_turn_metrics(samples: list[Sample]) -> dict[str, float]:
    """Turns per trajectory (Miles' round number), tool calls and errors per trajectory, the share that
    used a tool and that hit --generate-max-turns, response length with and without observation tokens,
    and the pass rate of the trajectories that took each number of turns."""
    if not samples or not any(s.turns for s in samples):
        return {}
    n = len(samples)
    turns = [s.num_turns for s in samples]
    model_tokens = [sum(s.loss_mask) if s.loss_mask is not None else s.response_length for s in samples]
    calls = [s.metadata.get("tool_calls", 0) for s in samples]
    metrics = {
        **_spread("round_number", turns),
        **_spread("raw_response_length", [s.response_length for s in samples]),
        **_spread("wo_obs_response_length", model_tokens),
        "multi_turn/tool_calls": sum(calls) / n,
        "multi_turn/tool_errors": sum(s.metadata.get("tool_errors", 0) for s in samples) / n,
        "multi_turn/tool_use_ratio": sum(c > 0 for c in calls) / n,
        "multi_turn/max_turns_ratio": sum(bool(s.metadata.get("hit_max_turns")) for s in samples) / n,
    }
    by_turns: dict[int, list[float]] = defaultdict(list)
    for sample, k in zip(samples, turns):
        by_turns[k].append(float((sample.reward or 0) > 0))
    for k, passes in sorted(by_turns.items()):
        metrics[f"multi_turn/pass_rate_turns_{k}"] = sum(passes) / len(passes)
    return metrics
