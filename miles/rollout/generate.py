"""Sampling through SGLang's native `/generate`: one batched request per prompt for the built-in
single-turn generate (or one call per sample of a `--custom-generate-function-path` function, given a
`GenerateFnInput`), a bounded number of samples in flight.

Each sample gets its own seed derived from (seed, rollout_id, index), so a rollout is
the same whichever engine serves it and however requests interleave. The rollout side
knows nothing of training; it returns `Sample`s with token ids, engine log-probs,
finish reasons and the weight version that produced them.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from miles.rollout.data import Prompt
from miles.rollout.http_client import HttpxPoster, LeanPoster, PostFailed, json_poster
from miles.rollout.routed_experts import read_routed_experts, wanted_routing
from miles.rollout.sample import FINISH_TO_STATUS, Sample, Status


@dataclass(frozen=True)
class RolloutSampling:
    """What the rollout asks of every sample (the subset of SGLang's sampling params it sets)."""

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


class NoEngineLeft(RuntimeError):
    """Raised by the rollout client when the supervisor says no engine can come back (its reason)."""


class GenerateError(RuntimeError):
    """The engine or router refused or broke a /generate request."""


ROUTING_KEY_HEADER = "X-SMG-Routing-Key"  # SGLang's gateway name: one key, one engine
# Answers that mean no engine served the request (the router had none ready, or every failover failed):
# with --use-fault-tolerance the request is sent again until an engine is back, within --engine-wait-timeout.
NOT_SERVED = frozenset({502, 503})
RESEND_BACKOFF_S = (0.2, 2.0)  # first wait, cap (doubling in between)
_resends = [0]
_resends_lock = threading.Lock()


# --use-fault-tolerance: the supervisor's "gave up" check (its reason, or None while an engine can come back);
# a request no engine served stops waiting once it says so, instead of idling out --engine-wait-timeout
_outage: list[Callable[[], str | None] | None] = [None]


def watch_outage(check: Callable[[], str | None] | None) -> None:
    """Set (or clear, with None) the check the rollout client asks before waiting for an engine again."""
    _outage[0] = check


def outage() -> str | None:
    """Why no engine can serve again (the supervisor gave up), or None."""
    check = _outage[0]
    return None if check is None else check()


def take_resends() -> int:
    """Requests this process re-sent since the previous call (the trainer reads it once per iteration)."""
    with _resends_lock:
        count, _resends[0] = _resends[0], 0
        return count


def _count_resend() -> None:
    with _resends_lock:
        _resends[0] += 1


def resend_deadline(args: Any) -> float | None:
    """Seconds a request may wait for an engine, from the run's flags; None: fail at once (no supervision)."""
    if args is None or not getattr(args, "use_fault_tolerance", False):
        return None
    return float(getattr(args, "engine_wait_timeout", 300.0))


@dataclass
class GenerateState:
    """The run context a generate function gets: the tokenizer, Miles-style `args`, and a shared
    /generate client bounded by `--sglang-server-concurrency`."""

    url: str
    tokenizer: Any
    args: Any
    client: LeanPoster | HttpxPoster  # pooled keep-alive connections to `url` (http_client.py)
    gate: asyncio.Semaphore
    # (MoE layers, top_k) when the run records each token's routed experts (rollout/routed_experts.py)
    routing: tuple[int, int] | None = None

    def payload(self, prompt: Any, sampling_params: Any) -> dict[str, Any]:
        """The built-in generate's /generate body (asking for routed experts when the run wants them)."""
        body = {"input_ids": prompt, "sampling_params": sampling_params, "return_logprob": True}
        if self.routing is not None:
            body["return_routed_experts"] = True
        return body

    async def generate(self, payload: dict[str, Any], routing_key: str | None = None) -> dict[str, Any]:
        """POST /generate; with `routing_key`, every request of that key goes to the same engine."""
        headers = {ROUTING_KEY_HEADER: routing_key} if routing_key else None
        wait = resend_deadline(self.args)
        deadline = None if wait is None else time.monotonic() + wait
        delay = RESEND_BACKOFF_S[0]
        while True:
            async with self.gate:
                try:
                    status, body, failure = *(await self.client.post("/generate", payload, headers)), None
                except PostFailed as exc:
                    status, body, failure = None, b"", exc
            if status is not None and status not in NOT_SERVED:
                break
            # never answered by an engine: the same payload (same per-sample seeds) can go again, and gives
            # the same tokens whichever engine serves it, unless the supervisor gave up on every engine
            if deadline is not None and (reason := outage()) is not None:
                raise NoEngineLeft(reason)
            if deadline is None or time.monotonic() + delay > deadline:
                if failure is not None:
                    raise GenerateError(f"{self.url}: {failure}" + _waited(wait)) from None
                break
            _count_resend()
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESEND_BACKOFF_S[1])
        if status != 200:
            text = body[:300].decode("utf-8", "replace")
            raise GenerateError(f"POST {self.url}/generate answered {status}: {text}"
                                + (_waited(wait) if status in NOT_SERVED else ""))
        try:
            return json.loads(body)
        except ValueError as exc:
            raise GenerateError(f"POST {self.url}/generate answered 200 with a body that is not JSON: {exc}") from None


def _waited(wait: float | None) -> str:
    return "" if wait is None else f" (no engine served it within --engine-wait-timeout {wait:g} s)"


@dataclass(frozen=True)
class GenerateFnInput:
    """What `--custom-generate-function-path` functions receive (Miles' shape): the sample to finish
    (`tokens` holds the prompt ids), its sampling params as /generate JSON, and the run context."""

    state: GenerateState
    sample: Sample
    sampling_params: dict[str, Any]
    evaluation: bool

    @property
    def args(self):
        return self.state.args


def read_reply(reply: dict[str, Any]) -> tuple[list[int], list[float], str, str | None]:
    """(new token ids, their log-probs, finish type, weight version) of one /generate answer."""
    meta = reply.get("meta_info") or {}
    pairs = meta.get("output_token_logprobs")
    if pairs is None:
        raise GenerateError(f"/generate reply has no meta_info.output_token_logprobs: {sorted(meta)}")
    finish = (meta.get("finish_reason") or {}).get("type", "stop")
    version = meta.get("weight_version")
    return [int(p[1]) for p in pairs], [float(p[0]) for p in pairs], finish, None if version is None else str(version)


async def generate(input: GenerateFnInput) -> Sample:
    """The built-in single-turn generate function: one /generate call per sample."""
    sample = input.sample
    prompt_ids = list(sample.tokens)
    reply = await input.state.generate(input.state.payload(prompt_ids, input.sampling_params))
    return _apply_reply(sample, prompt_ids, reply, input.state)


def token_versions(reply: dict[str, Any], count: int) -> list[str] | None:
    """The weight version of each of `count` new tokens, when the engine reports them (ours does, as
    meta_info.output_token_weight_versions; SGLang reports one version per request: None)."""
    versions = (reply.get("meta_info") or {}).get("output_token_weight_versions")
    if not isinstance(versions, list) or len(versions) != count:
        return None
    return [str(v) for v in versions]


def _apply_reply(sample: Sample, prompt_ids: list[int], reply: dict[str, Any],
                 state: GenerateState) -> Sample:
    response_ids, log_probs, finish, sample.weight_version = read_reply(reply)
    if state.routing is not None:
        sample.routed_experts = read_routed_experts(reply.get("meta_info") or {}, state.routing)
    sample.token_weight_versions = token_versions(reply, len(response_ids))
    sample.tokens = prompt_ids + response_ids
    sample.response_length = len(response_ids)
    sample.rollout_log_probs = log_probs
    sample.response = state.tokenizer.decode(response_ids, skip_special_tokens=True)
    sample.status = FINISH_TO_STATUS.get(finish, Status.COMPLETED)
    return sample


async def generate_group(state: GenerateState, samples: list[Sample], params: list[dict]) -> list[Sample]:
    """The built-in single-turn path for the samples of one prompt: one batched /generate (SGLang's list
    form: one input_ids and one sampling_params entry per sample, each with its own seed), so a rollout
    sends a request per prompt instead of per sample. Each sample gets exactly the tokens its own request
    would (per-request seeds do not depend on batching)."""
    prompts = [list(s.tokens) for s in samples]
    reply = await state.generate(state.payload(prompts, params))
    if not isinstance(reply, list) or len(reply) != len(samples):
        raise GenerateError(f"a batched /generate of {len(samples)} prompts answered "
                            f"{len(reply) if isinstance(reply, list) else type(reply).__name__} items")
    return [_apply_reply(s, ids, r, state) for s, ids, r in zip(samples, prompts, reply)]


async def _finish(fn: Callable, state: GenerateState, sample: Sample, params: dict, evaluation: bool) -> Sample:
    out = await fn(GenerateFnInput(state, sample, params, evaluation))
    if not isinstance(out, Sample):
        raise GenerateError(f"the generate function returned {type(out).__name__}, expected the finished Sample")
    return out


Admit = Callable[[], Awaitable[None]]


async def _admitted(admit: Admit | None, work: Callable[[], Awaitable[Any]]) -> Any:
    """Start `work` once `admit` lets it (async training's admission control; None: at once)."""
    if admit is not None:
        await admit()
    return await work()


async def _generate_all(url: str, jobs: list[tuple[dict, Sample]], tokenizer, args, fn: Callable,
                        concurrency: int, timeout: float, evaluation: bool, admit: Admit | None = None
                        ) -> list[Sample]:
    client = json_poster(url, timeout, concurrency)
    routing = None if evaluation else wanted_routing(args)  # evals train nothing: no routing record
    try:
        if fn is not generate:  # a custom function: one call per sample, as Miles makes them
            state = GenerateState(url, tokenizer, args, client, asyncio.Semaphore(concurrency),
                                  routing)
            return list(await asyncio.gather(*(_admitted(admit, lambda b=base, p=params: _finish(fn, state, b, p,
                                                                                               evaluation))
                                               for params, base in jobs)))
        groups: dict[int, list[tuple[dict, Sample]]] = {}
        for params, base in jobs:
            groups.setdefault(base.group_index, []).append((params, base))
        # at most `concurrency` samples in flight, as with one request per sample
        largest = max((len(g) for g in groups.values()), default=1)
        state = GenerateState(url, tokenizer, args, client, asyncio.Semaphore(max(1, concurrency // largest)),
                              routing)
        done = await asyncio.gather(*(_admitted(admit, lambda g=g: generate_group(state, [b for _, b in g],
                                                                                  [p for p, _ in g]))
                                      for g in groups.values()))
        return sorted((s for group in done for s in group), key=lambda s: s.index)
    finally:
        await client.aclose()


def encode_prompt(tokenizer, text: str, apply_chat_template: bool) -> list[int]:
    if apply_chat_template:
        # Render the template to text and encode that, as SGLang's chat path does: the template already
        # holds the special tokens, and `apply_chat_template(tokenize=True)` returns a list or a
        # BatchEncoding depending on the tokenizer class and transformers version.
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def generate_groups(url: str, prompts: list[Prompt], n_samples: int, tokenizer, params: RolloutSampling, *,
                    seed: int, stream: str, rollout_id: int, concurrency: int, apply_chat_template: bool = False,
                    timeout: float = 600.0, generate_fn: Callable | None = None, args: Any = None,
                    admit: Admit | None = None) -> list[Sample]:
    """`n_samples` samples for each prompt, in prompt-major order (group g = prompt g), each finished
    by `generate_fn` (default: the single-turn `generate`, sent as one batched request per prompt).
    With `admit`, each request (a group's, or a custom function's call) first awaits it."""
    jobs = []
    for g, prompt in enumerate(prompts):
        ids = encode_prompt(tokenizer, prompt.prompt, apply_chat_template)
        for j in range(n_samples):
            index = g * n_samples + j
            params_json = params.to_json(sample_seed(seed, stream, rollout_id, index))
            jobs.append((params_json, Sample(index=index, group_index=g, prompt=prompt.prompt, label=prompt.label,
                                             tokens=list(ids))))
    return asyncio.run(_generate_all(url.rstrip("/"), jobs, tokenizer, args, generate_fn or generate, concurrency,
                                     timeout, evaluation=stream != "train", admit=admit))
