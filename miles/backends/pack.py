"""Splitting a rollout across ranks and optimizer steps, and adding the ranks' results back up."""
from __future__ import annotations

from dataclasses import dataclass, field

from miles.backends.base import RankBatch, RankTrainResult
from miles.backends.mismatch import merge as merge_mismatch
from miles.backends.mismatch import metrics as mismatch_metrics
from miles.rollout.sample import Sample


def split_for_ranks(samples: list[Sample], advantages: list[float], global_batch_size: int, world_size: int,
                    rollout_id: int, return_token_stats: bool = False) -> list[RankBatch]:
    """Step s trains on samples [s*gbs, (s+1)*gbs); rank k takes the k-th contiguous slice of it."""
    if len(samples) % global_batch_size:
        raise ValueError(f"{len(samples)} samples do not split into global batches of {global_batch_size}")
    per_rank = global_batch_size // world_size
    steps = len(samples) // global_batch_size
    batches = []
    for rank in range(world_size):
        rows = [s * global_batch_size + rank * per_rank + i for s in range(steps) for i in range(per_rank)]
        batches.append(RankBatch(
            tokens=[samples[i].tokens for i in rows],
            response_lengths=[samples[i].response_length for i in rows],
            advantages=[advantages[i] for i in rows],
            rollout_log_probs=[samples[i].rollout_log_probs for i in rows],
            step_sizes=[per_rank] * steps,
            global_step_sizes=[global_batch_size] * steps,
            rollout_id=rollout_id,
            loss_masks=[samples[i].loss_mask for i in rows],
            sample_indices=[samples[i].index for i in rows],
            return_token_stats=return_token_stats,
            routed_experts=routed_experts_of([samples[i] for i in rows]),
        ))
    return batches


def routed_experts_of(samples: list[Sample]) -> list | None:
    """The samples' routing records when every one has one (R3 and its mismatch metric are per batch)."""
    records = [s.routed_experts for s in samples]
    return records if records and all(r is not None for r in records) else None


def replica_of_rank(rank: int, tp: int, pp: int, world: int) -> int:
    """The data-parallel replica a training rank belongs to, in megatron-core's default rank order
    (tp-cp-ep-dp-pp: TP fastest, then DP, PP slowest; no context or expert parallelism here)."""
    return (rank // tp) % (world // (tp * pp))


def split_for_replicas(samples: list[Sample], advantages: list[float], global_batch_size: int,
                       tp: int, pp: int, dp: int, rollout_id: int,
                       return_token_stats: bool = False) -> list[RankBatch]:
    """One batch per training rank: the rollout split over the `dp` model replicas, and every rank
    of a replica's TP x PP group handed that replica's batch (they train the same samples). With
    TP = PP = 1 this is `split_for_ranks` over the world."""
    replicas = split_for_ranks(samples, advantages, global_batch_size, dp, rollout_id,
                               return_token_stats)
    world = tp * pp * dp
    return [replicas[replica_of_rank(rank, tp, pp, world)] for rank in range(world)]

@dataclass
class TrainSummary:
    metrics: dict[str, float]  # train/* and the rollout/* log-prob metrics
    num_tokens: int  # tokens trained on, all ranks
    log_probs_time: float  # slowest rank
    ref_log_probs_time: float
    actor_train_time: float
    phases: dict[int, list[tuple[str, float, float]]] = field(default_factory=dict)  # rank -> its phases
    token_stats: dict[int, dict[str, list[float]]] = field(default_factory=dict)  # sample index -> per token


def combine(results: list[RankTrainResult]) -> TrainSummary:
    """Per-sample means over all ranks; per-step values (grad_norm, lr) averaged over steps."""
    total = sum(r.num_samples for r in results)
    keys = sorted({k for r in results for k in r.sums})
    metrics = {k: sum(r.sums.get(k, 0.0) for r in results) / total for k in keys}
    for key, values in results[0].step_values.items():
        metrics[key] = sum(values) / len(values)
    for key in sorted({k for r in results for k in r.maxes}):
        metrics[key] = max(r.maxes[key] for r in results if key in r.maxes)
    # token means over every rank's response tokens: the ranks' sums and counts added, divided once
    metrics.update(mismatch_metrics(merge_mismatch([r.mismatch for r in results])))
    token_stats = {index: stats for r in results for index, stats in r.token_stats.items()}
    return TrainSummary(metrics, sum(r.num_tokens for r in results), max(r.log_probs_time for r in results),
                        max(r.ref_log_probs_time for r in results), max(r.actor_train_time for r in results),
                        {rank: r.phases for rank, r in enumerate(results)}, token_stats)
