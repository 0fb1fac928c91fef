"""The rollout phase against its in-process limit: the default rollout through router and engine vs one batched
HF `generate` of the same prompts, with the same model and torch threads; plus short-request req/s and
tokens/s at 64 new tokens.

    .venv/bin/python benchmarks/rollout.py [--reps 5] [--short-requests 1024]

Everything runs in one invocation, side by side: an engine (the default `EngineConfig`: max batch 64, one
torch thread) and a router in front of it start as the default run starts them; the rollout is the default
config's (`--rollout-batch-size` 32 prompts x `--n-samples-per-prompt` 8, at most 8 new tokens, T=1,
`--sglang-server-concurrency` 64), sent by the trainer's own `generate_groups` (and its HTTP client for the req/s and tokens/s figures), through the router and,
to see what the router adds, straight to the engine. The in-process limit is `model.generate` on the same
left-padded prompts with a KV cache in this process (the engine idles meanwhile). Each figure is the median
of --reps runs. Prints a table, then one JSON line with the figures and ratios.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from miles.config import EngineConfig, RolloutConfig, RouterConfig  # noqa: E402
from miles.engines.launch import launch_engine  # noqa: E402
from miles.rollout.data import read_prompts  # noqa: E402
from miles.rollout.generate import RolloutSampling, encode_prompt, generate_groups  # noqa: E402
from miles.rollout.http_client import json_poster  # noqa: E402
from miles.router.launch import launch_router  # noqa: E402
from miles.tiny.warmstart import default_task_data, ensure_base_model  # noqa: E402


def rollout_seconds(url: str, prompts, tokenizer, rollout: RolloutConfig, rollout_id: int) -> tuple[float, int]:
    params = RolloutSampling(rollout.rollout_temperature, rollout.rollout_top_p, rollout.rollout_top_k,
                             rollout.rollout_max_response_len)
    start = time.perf_counter()
    samples = generate_groups(url, prompts, rollout.n_samples_per_prompt, tokenizer, params, seed=1234,
                              stream="train", rollout_id=rollout_id, concurrency=rollout.sglang_server_concurrency)
    return time.perf_counter() - start, sum(s.response_length for s in samples)


def left_padded(prompt_ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompt_ids):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids, mask


def in_process_seconds(model, tokenizer, prompt_ids: list[list[int]], max_new_tokens: int, temperature: float,
                       exact_length: bool) -> tuple[float, int]:
    """One batched `generate` with a KV cache (the in-process limit); returns seconds and new tokens."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids, mask = left_padded(prompt_ids, pad_id)
    extra = {"min_new_tokens": max_new_tokens} if exact_length else {}
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=temperature, top_p=1.0,
                             top_k=0, max_new_tokens=max_new_tokens, pad_token_id=pad_id, **extra)
    seconds = time.perf_counter() - start
    new = out[:, ids.shape[1]:]
    eos = set(model.generation_config.eos_token_id if isinstance(model.generation_config.eos_token_id, list)
              else [model.generation_config.eos_token_id])
    tokens = 0
    for row in new.tolist():  # up to and including the first EOS, as the engine counts them
        for t in row:
            tokens += 1
            if t in eos:
                break
    return seconds, tokens


async def concurrent_requests(url: str, bodies: list[dict], concurrency: int) -> tuple[float, int]:
    """Send `bodies` to /generate with `concurrency` in flight over the rollout's own client; seconds, tokens."""
    client = json_poster(url, 600.0, concurrency)
    gate = asyncio.Semaphore(concurrency)

    async def one(body):
        async with gate:
            status, raw = await client.post("/generate", body)
        if status != 200:
            raise RuntimeError(f"/generate answered {status}: {raw[:200]!r}")
        return json.loads(raw)["meta_info"]["completion_tokens"]

    try:
        start = time.perf_counter()
        tokens = await asyncio.gather(*(one(b) for b in bodies))
        return time.perf_counter() - start, sum(tokens)
    finally:
        await client.aclose()


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="runs per figure; the median is reported")
    parser.add_argument("--short-requests", type=int, default=1024, help="requests of the req/s figure")
    parser.add_argument("--concurrency", type=int, default=64, help="in flight for req/s and tokens/s")
    parser.add_argument("--long-tokens", type=int, default=64, help="new tokens per request of the tokens/s figure")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    engine_cfg, rollout = EngineConfig(engine_device="cpu"), RolloutConfig()
    torch.set_num_threads(engine_cfg.engine_cpu_threads)  # the engine's torch threads, for the in-process limit
    model_dir = ensure_base_model(progress=False)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    train_path, _ = default_task_data()
    prompts = read_prompts(train_path, "prompt", "label")[:rollout.rollout_batch_size]
    prompt_ids = [encode_prompt(tokenizer, p.prompt, False) for p in prompts]
    rollout_ids = [ids for ids in prompt_ids for _ in range(rollout.n_samples_per_prompt)]
    long_ids = [prompt_ids[i % len(prompt_ids)] for i in range(args.concurrency)]

    with launch_engine(model_dir, engine_cfg) as engine, \
            launch_router(RouterConfig(), worker_urls=[engine.url]) as router:
        rollout_seconds(router.url, prompts, tokenizer, rollout, 0)  # warm-up: first-call allocations out
        in_process_seconds(model, tokenizer, rollout_ids, rollout.rollout_max_response_len, 1.0, False)
        via_router, direct, limit = [], [], []
        for rep in range(args.reps):  # interleaved, so a noisy neighbour hits all three alike
            via_router.append(rollout_seconds(router.url, prompts, tokenizer, rollout, rep + 1)[0])
            direct.append(rollout_seconds(engine.url, prompts, tokenizer, rollout, rep + 1)[0])
            limit.append(in_process_seconds(model, tokenizer, rollout_ids, rollout.rollout_max_response_len, 1.0,
                                            False)[0])

        short = [{"input_ids": prompt_ids[i % len(prompt_ids)], "return_logprob": True,
                  "sampling_params": {"max_new_tokens": 1, "temperature": 1.0, "seed": i}}
                 for i in range(args.short_requests)]
        short_router = [concurrent_requests_sync(router.url, short, args.concurrency)[0] for _ in range(args.reps)]
        short_direct = [concurrent_requests_sync(engine.url, short, args.concurrency)[0] for _ in range(args.reps)]

        long = [{"input_ids": ids, "sampling_params": {"max_new_tokens": args.long_tokens, "temperature": 1.0,
                                                       "ignore_eos": True, "seed": i}}
                for i, ids in enumerate(long_ids)]
        long_router, long_limit = [], []
        for _ in range(args.reps):
            seconds, tokens = concurrent_requests_sync(router.url, long, args.concurrency)
            long_router.append(tokens / seconds)
            seconds, tokens = in_process_seconds(model, tokenizer, long_ids, args.long_tokens, 1.0, True)
            long_limit.append(tokens / seconds)
        info = httpx.get(engine.url + "/get_server_info").json()

    rows = {
        "rollout_router_s": median(via_router), "rollout_direct_s": median(direct), "rollout_in_process_s": median(limit),
        "short_req_per_s_router": args.short_requests / median(short_router),
        "short_req_per_s_direct": args.short_requests / median(short_direct),
        "tokens_per_s_router": median(long_router), "tokens_per_s_in_process": median(long_limit),
    }
    ratios = {
        "rollout_vs_in_process": rows["rollout_router_s"] / rows["rollout_in_process_s"],
        "router_overhead": rows["rollout_router_s"] / rows["rollout_direct_s"] - 1.0,
        "tokens_per_s_vs_in_process": rows["tokens_per_s_router"] / rows["tokens_per_s_in_process"],
    }
    samples = rollout.rollout_batch_size * rollout.n_samples_per_prompt
    print(f"{'figure':<44}{'value':>12}")
    print(f"{f'rollout {samples} samples, router+engine (s)':<44}{rows['rollout_router_s']:>12.3f}")
    print(f"{'rollout, straight to the engine (s)':<44}{rows['rollout_direct_s']:>12.3f}")
    print(f"{'rollout, in-process batched generate (s)':<44}{rows['rollout_in_process_s']:>12.3f}")
    print(f"{f'short req/s at {args.concurrency} concurrent, router':<44}{rows['short_req_per_s_router']:>12.1f}")
    print(f"{f'short req/s at {args.concurrency} concurrent, direct':<44}{rows['short_req_per_s_direct']:>12.1f}")
    print(f"{f'tokens/s at {args.long_tokens} new tokens, router':<44}{rows['tokens_per_s_router']:>12.1f}")
    print(f"{f'tokens/s at {args.long_tokens} new tokens, in-process':<44}{rows['tokens_per_s_in_process']:>12.1f}")
    print(f"rollout / in-process limit: {ratios['rollout_vs_in_process']:.2f}x (goal <= 2x); router adds "
          f"{100 * ratios['router_overhead']:.1f}% (goal <= 10%); engine mean rows per decode step "
          f"{info['mean_batch_size']}, most {info['max_batch_size_seen']}")
    print(json.dumps({**{k: round(v, 4) for k, v in rows.items()}, **{k: round(v, 4) for k, v in ratios.items()},
                      "reps": args.reps, "samples": samples, "concurrency": args.concurrency,
                      "torch_threads": engine_cfg.engine_cpu_threads, "mean_rows_per_decode_step":
                      info["mean_batch_size"], "max_batch_size_seen": info["max_batch_size_seen"]}))
    return 0


def concurrent_requests_sync(url: str, bodies: list[dict], concurrency: int) -> tuple[float, int]:
    return asyncio.run(concurrent_requests(url, bodies, concurrency))


if __name__ == "__main__":
    sys.exit(main())
