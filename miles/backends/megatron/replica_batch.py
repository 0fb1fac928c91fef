"""One model replica's batch: the samples the trainer gave each rank of its model-parallel group.

The ranks of one model-parallel group (TP x PP) must all run the same samples. A trainer that
splits a rollout over all training ranks, as for data parallelism alone, gives each member its own
slice: the members pool theirs (every step's samples of every member, in member order), so each
replica trains on its group's samples and every sample once in the world. A trainer that splits by
replica (`miles.backends.pack.split_for_replicas`) gives every member the same batch: that one is used as it is. One member reports the
group's metrics either way.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from miles.backends.base import RankBatch

PER_SAMPLE = ("tokens", "response_lengths", "advantages", "rollout_log_probs")


def same(a: RankBatch, b: RankBatch) -> bool:
    """Equal batches, their routing records (numpy arrays, which `==` compares elementwise)
    compared array by array."""
    ra, rb = a.routed_experts, b.routed_experts
    if dataclasses.replace(a, routed_experts=None) != dataclasses.replace(b, routed_experts=None):
        return False
    if ra is None or rb is None:
        return ra is rb
    return len(ra) == len(rb) and all(np.array_equal(x, y) for x, y in zip(ra, rb))


def merge(batches: list[RankBatch]) -> RankBatch:
    """The members' batches as one, step by step (each member's step s rows, in member order)."""
    first = batches[0]
    if all(same(b, first) for b in batches[1:]):  # split by replica: each has the whole batch
        return first
    steps = len(first.step_sizes)
    if any(len(b.step_sizes) != steps or b.global_step_sizes != first.global_step_sizes
           for b in batches):
        raise ValueError("the model-parallel group's batches disagree on the optimizer steps")
    rows: list[tuple[RankBatch, int]] = []
    for step in range(steps):
        for b in batches:
            start = sum(b.step_sizes[:step])
            rows += [(b, start + i) for i in range(b.step_sizes[step])]
    fields = {name: [getattr(b, name)[i] for b, i in rows] for name in PER_SAMPLE}
    masks = None
    if any(b.loss_masks is not None for b in batches):
        masks = [b.loss_masks[i] if b.loss_masks is not None else None for b, i in rows]
    # R3's records ride along only when every member's samples carry them (as routed_experts_of)
    recorded = all(b.routed_experts is not None for b in batches)
    routed = [b.routed_experts[i] for b, i in rows] if recorded else None
    indexed = all(b.sample_indices for b in batches)
    indices = [b.sample_indices[i] for b, i in rows] if indexed else []
    step_sizes = [sum(b.step_sizes[s] for b in batches) for s in range(steps)]
    return RankBatch(**fields, step_sizes=step_sizes,
                     global_step_sizes=list(first.global_step_sizes),
                     rollout_id=first.rollout_id, loss_masks=masks, sample_indices=indices,
                     return_token_stats=first.return_token_stats, routed_experts=routed)
