"""Choose the next token of each row of a batch, each row with its own params and random generator.

Log-probs are those of the sampling distribution after temperature scaling,
log_softmax(logits / T) (the raw log_softmax at T=0 and T=1), taken *before* top-p /
top-k truncation and before min-new-tokens masking: exactly what a trainer recomputes
from the same weights. Each request samples with its own `torch.Generator`, so a seeded
request draws the same tokens whatever else shares its batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from miles.engines.sglang_request import SamplingParams


@dataclass
class RowSampler:
    params: SamplingParams
    generator: torch.Generator
    banned: tuple[int, ...] = ()  # tokens that may not be chosen now (EOS before min_new_tokens)


@dataclass(frozen=True)
class Chosen:
    token_ids: list[int]
    logprobs: list[float]


def scaled_logprobs(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """(B, V) log_softmax(logits / T) in fp32; rows with T=0 (greedy) use T=1."""
    scale = torch.where(temperatures > 0, temperatures, torch.ones_like(temperatures))
    return torch.log_softmax(logits.float() / scale[:, None], dim=-1)


def _truncated_probs(logprobs: torch.Tensor, top_p: float, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs, token ids) of the tokens kept by top-k then top-p, most likely first, renormalised."""
    probs, ids = torch.sort(logprobs.exp(), descending=True)
    if top_k > 0:
        probs, ids = probs[:top_k], ids[:top_k]
    if top_p < 1.0:
        before = torch.cumsum(probs, dim=0) - probs  # mass of the more likely tokens
        keep = before < top_p
        keep[0] = True
        probs, ids = probs[keep], ids[keep]
    return probs / probs.sum(), ids


def choose(logits: torch.Tensor, rows: list[RowSampler]) -> Chosen:
    """Pick one token per row of `logits` (B, V) and report its log-prob."""
    temps = torch.tensor([r.params.temperature for r in rows], device=logits.device, dtype=torch.float32)
    logprobs = scaled_logprobs(logits, temps)  # (B, V)
    token_ids: list[int] = []
    for i, row in enumerate(rows):
        candidates = logprobs[i]
        if row.banned:
            candidates = candidates.clone()
            candidates[list(row.banned)] = float("-inf")
        if row.params.greedy:
            token_ids.append(int(candidates.argmax()))
            continue
        probs, ids = _truncated_probs(candidates, row.params.top_p, row.params.top_k)
        pick = torch.multinomial(probs, 1, generator=row.generator)
        token_ids.append(int(ids[pick]))
    index = torch.tensor(token_ids, device=logits.device)
    chosen = logprobs.gather(1, index[:, None])[:, 0]
    return Chosen(token_ids=token_ids, logprobs=chosen.tolist())
