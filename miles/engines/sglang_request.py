"""Parse and check SGLang `/generate` requests into typed values; every bad field is a 400 naming it.

Sampling fields follow SGLang's `SamplingParams`. Fields SGLang knows but this engine
does not implement (penalties, regex, ...) are refused unless they hold their neutral
value, so a rollout never silently samples from a different distribution than asked.
Unknown fields are ignored, as SGLang's HTTP server ignores unknown request keys.
"""
from __future__ import annotations

import itertools
import math
import uuid
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default

# SGLang sampling fields we accept only at their neutral value.
NEUTRAL_ONLY = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_p": 0.0,
                "n": 1, "regex": None, "json_schema": None, "ebnf": None}
# SGLang sampling fields that only shape text output and are accepted as they are.
ACCEPTED_AS_IS = ("spaces_between_special_tokens", "custom_params", "stream_interval")
# Sampling fields that change the distribution and are not implemented: refused unless empty.
UNSUPPORTED = ("logit_bias",)
SEED_RANGE = (0, 2**63 - 1)  # what a torch.Generator takes
# Request ids made here: a random per-process prefix and a counter (32 hex digits, like SGLang's uuid4 hex;
# uuid4 per request read os.urandom, measurably slow on the hot path).
_RID_PREFIX = uuid.uuid4().hex[:16]
_RID_COUNTER = itertools.count()


def new_rid() -> str:
    return f"{_RID_PREFIX}{next(_RID_COUNTER):016x}"


class RequestError(Exception):
    """A request the engine refuses; `status` is the HTTP code (4xx, or 503 when the queue is full)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param

    def body(self) -> dict:
        kind = {401: "AuthenticationError", 413: "RequestTooLargeError",
                503: "ServiceUnavailableError"}.get(self.status, "BadRequestError")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status},
                "object": "error", "message": self.message}


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0): no top-k truncation
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    min_new_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    skip_special_tokens: bool = True
    no_stop_trim: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class GenerateItem:
    """One prompt of a (possibly batched) /generate call."""

    rid: str
    text: str | None
    input_ids: list[int] | None
    params: SamplingParams
    return_logprob: bool
    return_routed_experts: bool = False


@dataclass(frozen=True)
class GenerateCall:
    items: list[GenerateItem]
    is_batch: bool
    stream: bool


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"sampling_params.{name} must be a number, got {value!r}", param=name)
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):  # JSON's NaN/Infinity literals parse to floats
        raise RequestError(f"sampling_params.{name} must be a finite number, got {value!r}", param=name)
    return number


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"sampling_params.{name} must be an integer, got {value!r}", param=name)
    return value


def _boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise RequestError(f"sampling_params.{name} must be true or false, got {value!r}", param=name)
    return value


# Every stop string is looked for after every token of its request, in the scheduler's thread, so
# their number and length bound the time one request can add to every step of its batch.
MAX_STOP_STRINGS = 256
MAX_STOP_CHARS = 4096
# Likewise every stop token id is compared with each new token, and the min_new_tokens ban list is
# rebuilt from them at every step: bounded like the stop strings.
MAX_STOP_TOKEN_IDS = 256


def _stop_strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if isinstance(items, list) and len(items) > MAX_STOP_STRINGS:
        raise RequestError(f"sampling_params.stop holds {len(items)} strings; at most {MAX_STOP_STRINGS} are "
                           f"accepted", param="stop")
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise RequestError(f"sampling_params.stop must be a non-empty string or a list of them, got "
                           f"{_short(value)}", param="stop")
    longest = max(len(s) for s in items) if items else 0
    if longest > MAX_STOP_CHARS:
        raise RequestError(f"sampling_params.stop holds a string of {longest} characters; at most "
                           f"{MAX_STOP_CHARS} are accepted", param="stop")
    return tuple(items)


def _short(value: Any, limit: int = 200) -> str:
    """repr of a value, cut short: error messages must not echo a megabyte back."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def _token_ids(name: str, value: Any, limit: int) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, list) and len(value) > limit:  # before looking at each one
        raise RequestError(f"sampling_params.{name} holds {len(value)} ids; at most {limit} are accepted",
                           param=name)
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                              for t in value):
        raise RequestError(f"sampling_params.{name} must be a list of token ids, got {_short(value)}", param=name)
    return tuple(value)


def parse_sampling_params(raw: Any) -> SamplingParams:
    """Check SGLang sampling params (a dict or null) and fill in SGLang's defaults."""
    if raw is None:
        return SamplingParams()
    if not isinstance(raw, dict):
        raise RequestError(f"sampling_params must be an object, got {raw!r}", param="sampling_params")
    for name, neutral in NEUTRAL_ONLY.items():
        if raw.get(name, neutral) not in (neutral, None):
            raise RequestError(f"sampling_params.{name}={raw[name]!r} is not supported by the embedded engine "
                               f"(only {neutral!r})", param=name)
    for name in UNSUPPORTED:
        if raw.get(name):
            raise RequestError(f"sampling_params.{name} is not supported by the embedded engine", param=name)
    out: dict[str, Any] = {}
    if raw.get("temperature") is not None:
        out["temperature"] = _number("temperature", raw["temperature"])
        if out["temperature"] < 0:
            raise RequestError(f"sampling_params.temperature must be >= 0, got {raw['temperature']}",
                               param="temperature")
    if raw.get("top_p") is not None:
        out["top_p"] = _number("top_p", raw["top_p"])
        if not 0.0 < out["top_p"] <= 1.0:
            raise RequestError(f"sampling_params.top_p must be in (0, 1], got {raw['top_p']}", param="top_p")
    if raw.get("top_k") is not None:
        out["top_k"] = _integer("top_k", raw["top_k"])
        if out["top_k"] < -1:
            raise RequestError(f"sampling_params.top_k must be -1 (off) or >= 1, got {raw['top_k']}",
                               param="top_k")
    for name in ("max_new_tokens", "min_new_tokens"):
        if raw.get(name) is not None:
            out[name] = _integer(name, raw[name])
            if out[name] < 0:
                raise RequestError(f"sampling_params.{name} must be >= 0, got {raw[name]}", param=name)
    seed = raw.get("seed", raw.get("sampling_seed"))
    if seed is not None:
        out["seed"] = _integer("seed", seed)
        if not SEED_RANGE[0] <= out["seed"] <= SEED_RANGE[1]:
            raise RequestError(f"sampling_params.seed must be in [0, 2**63-1], got {seed}", param="seed")
    for name in ("ignore_eos", "skip_special_tokens", "no_stop_trim"):
        if raw.get(name) is not None:
            out[name] = _boolean(name, raw[name])
    out["stop"] = _stop_strings(raw.get("stop"))
    out["stop_token_ids"] = _token_ids("stop_token_ids", raw.get("stop_token_ids"), MAX_STOP_TOKEN_IDS)
    return SamplingParams(**out)


def _per_item(value: Any, n: int, name: str, is_batch: bool) -> list[Any]:
    """SGLang lets batched calls give one value for all prompts or a list with one per prompt."""
    if is_batch and isinstance(value, list):
        if len(value) != n:
            raise RequestError(f"{name} has {len(value)} entries for {n} prompts", param=name)
        return value
    return [value] * n


def _prompts(body: dict, max_prompt_ids: int | None = None) -> tuple[list[str | list[int]], bool]:
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise RequestError("give exactly one of `text` or `input_ids`", param="text")
    if text is not None:
        if isinstance(text, str):
            return [text], False
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return list(text), True
        raise RequestError(f"text must be a string or a non-empty list of strings, got {text!r}", param="text")
    if max_prompt_ids is not None and isinstance(ids, list) and ids:
        # length before the per-id checks: millions of ids are refused without looking at each one
        rows = ids if isinstance(ids[0], list) else [ids]
        longest = max(len(r) if isinstance(r, list) else 0 for r in rows)
        if longest > max_prompt_ids:
            raise RequestError(f"The input ({longest} tokens) is longer than the model's context length "
                               f"({max_prompt_ids} tokens).", param="input_ids")
    if isinstance(ids, list) and ids and all(_is_id(t) for t in ids):
        return [list(ids)], False
    if isinstance(ids, list) and ids and all(isinstance(r, list) and r and all(_is_id(t) for t in r) for r in ids):
        return [list(r) for r in ids], True
    raise RequestError("input_ids must be a non-empty list of token ids or a list of such lists",
                       param="input_ids")


def _is_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0


def parse_generate(body: Any, max_prompt_ids: int | None = None) -> GenerateCall:
    """A /generate body (already JSON-decoded) as typed items, or RequestError. `max_prompt_ids`: the
    context length; a longer `input_ids` prompt is refused before its ids are checked one by one."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    prompts, is_batch = _prompts(body, max_prompt_ids)
    n = len(prompts)
    params = [parse_sampling_params(p) for p in _per_item(body.get("sampling_params"), n, "sampling_params",
                                                          is_batch)]
    logprobs = _per_item(body.get("return_logprob", False), n, "return_logprob", is_batch)
    rids = _per_item(body.get("rid"), n, "rid", is_batch)
    routed = _per_item(body.get("return_routed_experts", False), n, "return_routed_experts", is_batch)
    if not is_batch and rids[0] is not None and not isinstance(rids[0], str):
        raise RequestError(f"rid must be a string, got {rids[0]!r}", param="rid")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"stream must be true or false, got {stream!r}", param="stream")
    if stream and is_batch:
        raise RequestError("stream is supported for single prompts only", param="stream")
    items = []
    for prompt, p, lp, rid, experts in zip(prompts, params, logprobs, rids, routed):
        if not isinstance(lp, bool):
            raise RequestError(f"return_logprob must be true or false, got {lp!r}", param="return_logprob")
        if not isinstance(experts, bool):
            raise RequestError(f"return_routed_experts must be true or false, got {_short(experts)}",
                               param="return_routed_experts")
        if rid is not None and not isinstance(rid, str):
            raise RequestError(f"rid must be a string, got {rid!r}", param="rid")
        items.append(GenerateItem(rid=rid or new_rid(), text=prompt if isinstance(prompt, str) else None,
                                  input_ids=prompt if isinstance(prompt, list) else None, params=p,
                                  return_logprob=lp, return_routed_experts=experts))
    return GenerateCall(items=items, is_batch=is_batch, stream=stream)


@dataclass(frozen=True)
class FinishReason:
    type: str  # "stop" | "length" | "abort"
    matched: int | str | None = None
    message: str | None = None

    def as_dict(self) -> dict:
        out: dict[str, Any] = {"type": self.type, "matched": self.matched}
        if self.message:
            out["message"] = self.message
        return out


@dataclass
class GenerationResult:
    """What the scheduler hands back for one request; the server turns it into SGLang's JSON."""

    rid: str
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_versions: list[str] = field(default_factory=list)  # the weight version that sampled each token
    finish_reason: FinishReason | None = None
    weight_version: str = "default"
    e2e_latency: float = 0.0
    routed_experts: Any = None  # (tokens read, MoE layers, top_k) ints, when the request asked for them
