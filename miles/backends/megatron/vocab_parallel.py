"""Per-token log-probs and entropy from vocab-parallel logits: no rank holds a full-vocab row.

Each tensor-parallel rank holds the logits of its own slice of the (padded) vocabulary, as
megatron-core's output layer leaves them with `parallel_output=True`. The softmax statistics are
combined over the TP group with three all-reduces, the pattern of megatron-core's
`vocab_parallel_cross_entropy`: the row max (MAX), then the sums of exp and of exp times logit
(SUM), and the sampled token's logit (SUM, only its owner contributes). Entropy is
log Z - E_p[z] with Z = sum exp(z), so it needs no full row either. The numbers are the
full-logit `miles.backends.logprobs.stats_from_logits` up to float rounding.

Columns past the real vocabulary (Megatron pads it to a multiple of TP) are masked out: the engines
sample from the real vocabulary only, so the trained and rollout log-probs stay comparable.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from miles.backends.logprobs import TokenStats


class _SumOverRanks(torch.autograd.Function):
    """All-reduce SUM forward, identity backward: every rank then computes the same loss from the
    sum, so d loss / d (its own part) is d loss / d sum (megatron's reduce-from-TP-region)."""

    @staticmethod
    def forward(ctx, tensor, group):
        tensor = tensor.clone()
        dist.all_reduce(tensor, group=group)
        return tensor

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _sum_over(tensor: torch.Tensor, group, size: int) -> torch.Tensor:
    return tensor if size == 1 else _SumOverRanks.apply(tensor, group)


def stats_from_vocab_shard(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float,
                           vocab_start: int, vocab_size: int, group=None) -> TokenStats:
    """`logits` (B, T, V_local) are columns [vocab_start, vocab_start + V_local) of the padded
    vocabulary; ids at or past `vocab_size` are padding. `group`: the TP group (None: one rank)."""
    size = 1 if group is None else dist.get_world_size(group)
    z = logits[:, :-1].float()  # position t predicts token t+1
    if temperature > 0:
        z = z / temperature
    local = z.shape[-1]
    real = torch.arange(vocab_start, vocab_start + local, device=z.device) < vocab_size
    if not bool(real.all()):
        z = z.masked_fill(~real, float("-inf"))
    peak = z.detach().amax(-1, keepdim=True)  # cancels out of every result: no gradient needed
    if size > 1:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
    shifted = z - peak
    e = shifted.exp()  # 0 on padding
    sum_e = _sum_over(e.sum(-1), group, size)
    sum_ez = _sum_over((e * shifted.masked_fill(~real, 0.0)).sum(-1), group, size)
    target = input_ids[:, 1:] - vocab_start
    mine = (target >= 0) & (target < local)
    picked = shifted.gather(-1, target.clamp(0, local - 1)[..., None]).squeeze(-1)
    picked = _sum_over(picked.masked_fill(~mine, 0.0), group, size)
    log_z = sum_e.log()
    return TokenStats(picked - log_z, log_z - sum_ez / sum_e)
