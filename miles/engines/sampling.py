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


def _untruncated(params: SamplingParams, vocab: int) -> bool:
    return params.top_p >= 1.0 and (params.top_k <= 0 or params.top_k >= vocab)


def choose(logits: torch.Tensor, rows: list[RowSampler]) -> Chosen:
    """Pick one token per row of `logits` (B, V) and report its log-prob.

    Rows that sample from the whole distribution (top_p 1, no top_k: the rollout's default) are drawn
    together by inverse CDF: one uniform from each row's own generator, one cumsum and searchsorted for
    all of them (a loop of sort + multinomial per row was about as slow as the model's decode step at 64
    rows). Greedy and truncated rows take the per-row path."""
    temps = torch.tensor([r.params.temperature for r in rows], device=logits.device, dtype=torch.float32)
    logprobs = scaled_logprobs(logits, temps)  # (B, V)
    vocab = logprobs.shape[1]
    token_ids: list[int] = [0] * len(rows)
    whole = [i for i, r in enumerate(rows) if not r.params.greedy and _untruncated(r.params, vocab)]
    if whole:
        index = torch.tensor(whole, device=logits.device)
        candidates = logprobs.index_select(0, index)
        banned = [(j, rows[i].banned) for j, i in enumerate(whole) if rows[i].banned]
        if banned:
            candidates = candidates.clone()
            for j, tokens in banned:
                candidates[j, list(tokens)] = float("-inf")
        # float64 and u < 1 keep u * total below the last step of the CDF, so a zero-probability (banned)
        # token is never picked: the first index whose CDF passes u * total has probability > 0
        cdf = torch.cumsum(candidates.double().exp(), dim=-1)
        uniforms = torch.cat([torch.rand(1, generator=rows[i].generator, dtype=torch.float64) for i in whole])
        picks = torch.searchsorted(cdf, (uniforms.to(cdf.device) * cdf[:, -1])[:, None], right=True)[:, 0]
        picks = picks.clamp(max=vocab - 1)
        for i, token in zip(whole, picks.tolist()):
            token_ids[i] = token
    drawn = set(whole)
    for i, row in enumerate(rows):
        if i in drawn:
            continue
        candidates = logprobs[i]
        if row.banned:
            candidates = candidates.clone()
            candidates[list(row.banned)] = float("-inf")
        if row.params.greedy:
            token_ids[i] = int(candidates.argmax())
            continue
        probs, ids = _truncated_probs(candidates, row.params.top_p, row.params.top_k)
        pick = torch.multinomial(probs, 1, generator=row.generator)
        token_ids[i] = int(ids[pick])
    index = torch.tensor(token_ids, device=logits.device)
    chosen = logprobs.gather(1, index[:, None])[:, 0]
    return Chosen(token_ids=token_ids, logprobs=chosen.tolist())
