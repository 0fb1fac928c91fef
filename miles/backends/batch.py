"""Turning a rank's samples into padded tensors, one micro-batch at a time.

Position t of the logits predicts token t+1, so every per-token tensor here is (B, T-1)
and a sample's response occupies positions [prompt_len - 1, prompt_len - 1 + response_len).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from miles.backends.base import RankBatch


@dataclass
class MicroBatch:
    step: int  # which optimizer step it belongs to
    input_ids: torch.Tensor  # (B, T) right-padded
    attention_mask: torch.Tensor  # (B, T)
    response_mask: torch.Tensor  # (B, T-1) 1.0 on positions that predict a response token the model wrote
    # (observation tokens of a multi-turn sample are 0: out of the loss, the KL and every token metric)
    advantages: torch.Tensor  # (B, T-1) the sample's advantage on its response positions
    rollout_log_probs: torch.Tensor  # (B, T-1) engine log-probs on response positions
    num_tokens: int  # real (unpadded) tokens
    rows: list[int]  # which of the rank batch's samples, in order
    # (B, T, MoE layers, top_k) the experts the engine routed each token to, -1 where it read none (the
    # last token, padding), in the records' integer type; None: the batch carries no routing record
    routed_experts: torch.Tensor | None = None


def collate(batch: RankBatch, rows: list[int], step: int, pad_id: int, device: torch.device) -> MicroBatch:
    width = max(len(batch.tokens[i]) for i in rows)
    b = len(rows)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    resp = torch.zeros((b, width - 1))
    adv = torch.zeros((b, width - 1))
    rlp = torch.zeros((b, width - 1))
    for r, i in enumerate(rows):
        tokens, n_resp = batch.tokens[i], batch.response_lengths[i]
        ids[r, : len(tokens)] = torch.tensor(tokens)
        attn[r, : len(tokens)] = 1
        start = len(tokens) - n_resp - 1
        mask = batch.loss_masks[i] if batch.loss_masks else None
        resp[r, start: start + n_resp] = 1.0 if mask is None else torch.tensor(mask, dtype=resp.dtype)
        adv[r, start: start + n_resp] = batch.advantages[i]
        if batch.rollout_log_probs[i]:
            rlp[r, start: start + n_resp] = torch.tensor(batch.rollout_log_probs[i])
    num_tokens = int(attn.sum())
    routed = None if batch.routed_experts is None else routed_rows(batch, rows, width).to(device)
    return MicroBatch(step, ids.to(device), attn.to(device), resp.to(device), adv.to(device), rlp.to(device),
                      num_tokens, list(rows), routed)


def routed_rows(batch: RankBatch, rows: list[int], width: int) -> torch.Tensor:
    """The rows' routing records, right-padded like the tokens, -1 where the engine read no token."""
    records = [np.asarray(batch.routed_experts[i]) for i in rows]
    layers, top_k = records[0].shape[1:]
    # the records' own compact integer type (int8 up to 127 experts), not int64: 8x less to hold
    dtype = torch.from_numpy(np.zeros(0, records[0].dtype)).dtype
    out = torch.full((len(rows), width, layers, top_k), -1, dtype=dtype)
    for r, record in enumerate(records):
        n = min(len(record), width)  # the engine read every token but the last
        out[r, :n] = torch.from_numpy(record[:n].astype(records[0].dtype))
    return out


def micro_batches(batch: RankBatch, micro_batch_size: int, pad_id: int, device: torch.device) -> list[MicroBatch]:
    """Each optimizer step's samples, in order, cut into micro-batches of at most `micro_batch_size`."""
    out, start = [], 0
    for step, size in enumerate(batch.step_sizes):
        for a in range(start, start + size, micro_batch_size):
            rows = list(range(a, min(a + micro_batch_size, start + size)))
            out.append(collate(batch, rows, step, pad_id, device))
        start += size
    return out
