"""Sampling through SGLang's native `/generate`: one request per sample, a bounded number in flight.

Each sample gets its own seed derived from (seed, rollout_id, index), so a rollout is
the same whichever engine serves it and however requests interleave. The rollout side
knows nothing of training; it returns `Sample`s with token ids, engine log-probs,
finish reasons and the weight version that produced them.
"""
from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from typing import Any

import httpx

from miles.rollout.data import Prompt
from miles.rollout.sample import FINISH_TO_STATUS, Sample, Status


@dataclass(frozen=True)
class SamplingParams:
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int

    def to_json(self, seed: int) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "max_new_tokens": self.max_new_tokens, "seed": seed}


def sample_seed(seed: int, stream: str, rollout_id: int, index: int) -> int:
    """A 31-bit seed per sample; `stream` keeps training and eval draws apart."""
    digest = hashlib.sha256(f"{seed}/{stream}/{rollout_id}/{index}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


class GenerateError(RuntimeError):
    """The engine or router refused or broke a /generate request."""


def _to_sample(prompt_ids: list[int], reply: dict[str, Any], tokenizer, base: Sample) -> Sample:
    meta = reply.get("meta_info") or {}
    pairs = meta.get("output_token_logprobs")
    if pairs is None:
        raise GenerateError(f"/generate reply has no meta_info.output_token_logprobs: {sorted(meta)}")
    response_ids = [int(p[1]) for p in pairs]
    finish = (meta.get("finish_reason") or {}).get("type", "stop")
    base.tokens = list(prompt_ids) + response_ids
    base.response_length = len(response_ids)
    base.rollout_log_probs = [float(p[0]) for p in pairs]
    base.response = tokenizer.decode(response_ids, skip_special_tokens=True)
    base.status = FINISH_TO_STATUS.get(finish, Status.COMPLETED)
    version = meta.get("weight_version")
    base.weight_version = None if version is None else str(version)
    return base


async def _generate_one(client: httpx.AsyncClient, url: str, gate: asyncio.Semaphore, prompt_ids: list[int],
                        params: dict[str, Any], tokenizer, base: Sample) -> Sample:
    payload = {"input_ids": prompt_ids, "sampling_params": params, "return_logprob": True}
    async with gate:
        response = await client.post(f"{url}/generate", json=payload)
    if response.status_code != 200:
        raise GenerateError(f"POST {url}/generate answered {response.status_code}: {response.text[:300]}")
    return _to_sample(prompt_ids, response.json(), tokenizer, base)


async def _generate_all(url: str, jobs: list[tuple[list[int], dict, Sample]], tokenizer, concurrency: int,
                        timeout: float) -> list[Sample]:
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        return list(await asyncio.gather(*(_generate_one(client, url, gate, ids, params, tokenizer, base)
                                           for ids, params, base in jobs)))


def encode_prompt(tokenizer, text: str, apply_chat_template: bool) -> list[int]:
    if apply_chat_template:
        return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                                  add_generation_prompt=True))
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def generate_groups(url: str, prompts: list[Prompt], n_samples: int, tokenizer, params: SamplingParams, *,
                    seed: int, stream: str, rollout_id: int, concurrency: int, apply_chat_template: bool = False,
                    timeout: float = 600.0) -> list[Sample]:
    """`n_samples` samples for each prompt, in prompt-major order (group g = prompt g)."""
    jobs = []
    for g, prompt in enumerate(prompts):
        ids = encode_prompt(tokenizer, prompt.prompt, apply_chat_template)
        for j in range(n_samples):
            index = g * n_samples + j
            params_json = params.to_json(sample_seed(seed, stream, rollout_id, index))
            jobs.append((ids, params_json, Sample(index=index, group_index=g, prompt=prompt.prompt,
                                                  label=prompt.label)))
    return asyncio.run(_generate_all(url.rstrip("/"), jobs, tokenizer, concurrency, timeout))
