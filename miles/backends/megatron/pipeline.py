"""Micro-batches through megatron-core's own forward/backward schedule (1F1B across stages).

`get_forward_backward_func()` picks the schedule for this rank's layout (no pipelining at PP = 1,
1F1B without interleaving at PP > 1); each stage runs its own layers and the schedule moves
activations and their gradients between stages. Only the last stage sees the model's output (the
vocab-parallel logits): `on_output` turns them into the micro-batch's loss there. The schedule
divides each micro-batch's loss by the micro-batch count (Megatron averages over micro-batches);
we hand it the loss multiplied by that count, so the backward pass takes exactly our loss.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Callable

import torch
import torch.distributed as dist

from miles.backends.batch import MicroBatch
from miles.backends.logprobs import TokenStats
from miles.backends.megatron import sequence_parallel, shim
from miles.backends.megatron.pipeline_spans import recording


def forward(model, mb: MicroBatch) -> torch.Tensor:
    """This stage's output: (B, T, V/TP) logits on the last stage, (T, B, H) activations before
    (T/TP with sequence parallel, T padded to a multiple of TP there: sequence_parallel.py)."""
    config = model.config
    tp = config.tensor_model_parallel_size if config.sequence_parallel else 1
    ids, padding = sequence_parallel.pad_right(mb.input_ids, tp)
    b, t = ids.shape
    positions = torch.arange(t, device=ids.device).expand(b, t)
    extra = {}
    if padding is not None and config.num_moe_experts:  # the routers leave the added pads out
        extra["padding_mask"] = padding if model.pre_process else \
            sequence_parallel.own_chunk(padding)
    # Right-padded rows: the causal mask alone is exact for the real tokens (pads come after them).
    out = model(ids, positions, attention_mask=None, **extra)
    if model.post_process and padding is not None:
        return out[:, :mb.input_ids.shape[1]]  # the logits of the real positions
    return out


def run(model, mbs: list[MicroBatch], on_output: Callable[[int, torch.Tensor], torch.Tensor],
        forward_only: bool, rec=None) -> None:
    """Every micro-batch through the schedule, in order; `on_output(k, logits)` (last stage only)
    gives the loss of micro-batch k. With `forward_only=False` the gradients accumulate in the
    parameters' `.grad`, and `rec` (a RankPhaseRecorder) gets the schedule's forward and backward
    spans and pipeline waits (pipeline_spans.py)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    count = len(mbs)
    if not count:
        return

    def step(data_iterator, stage):
        k = next(data_iterator)

        def loss_func(output):
            return on_output(k, output) * count, {}

        return forward(stage, mbs[k]), loss_func

    spans = recording(rec) if rec is not None and not forward_only else nullcontext()
    with shim.cuda_to_cpu(), spans:  # the schedules count tokens on "cuda" (shim 5)
        get_forward_backward_func()(
            forward_step_func=step, data_iterator=iter(range(count)), model=model,
            num_microbatches=count, forward_only=forward_only,
            # variable_seq_lengths: each stage sends its shapes first; these are upper bounds
            seq_length=max(mb.input_ids.shape[1] for mb in mbs),
            micro_batch_size=max(mb.input_ids.shape[0] for mb in mbs))


def broadcast_stats(stats: list[TokenStats | None], mbs: list[MicroBatch], src: int,
                    group) -> list[TokenStats]:
    """The last stage's per-token stats to every stage of the pipeline (one flat broadcast): each
    stage then reports and logs the same numbers as at PP = 1."""
    shapes = [(mb.input_ids.shape[0], mb.input_ids.shape[1] - 1) for mb in mbs]
    if dist.get_rank() == src:
        flat = torch.cat([torch.stack([s.log_probs, s.entropy]).detach().reshape(-1).cpu()
                          for s in stats])
    else:
        flat = torch.empty(sum(2 * b * t for b, t in shapes))
    dist.broadcast(flat, src=src, group=group)
    out, start = [], 0
    device = mbs[0].input_ids.device if mbs else torch.device("cpu")
    for b, t in shapes:
        pair = flat[start: start + 2 * b * t].view(2, b, t).to(device)
        out.append(TokenStats(pair[0], pair[1]))
        start += 2 * b * t
    return out
