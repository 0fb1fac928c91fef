"""A prepared check for a CUDA machine: the embedded engine on CUDA, one GRPO training step on CUDA with a CUDA
memory snapshot, and the rollout on CUDA against its in-process limit.

    .venv/bin/python benchmarks/gpu_check.py [--out DIR] [--model DIR]

Without CUDA it prints why and exits 0 without starting anything (a skip, not a failure). With CUDA:
1. the engine (`--engine-device cuda`) serves 64 concurrent /generate requests of 64 new tokens over the
   rollout's own client (tokens/s), and `/get_server_info` must say the device is cuda;
2. one training step of the default run's shape (256 samples of prompt + 8 response tokens) on CUDA: the
   token log-probs and PPO-clip loss of `miles.backends`, backward, AdamW (`build_optimizer`), with
   `torch.cuda.memory._record_memory_history` on, the snapshot dumped to DIR/cuda_memory_snapshot.pickle
   (open it at https://pytorch.org/memory_viz) and the peak allocated memory reported;
3. the default rollout through router and engine vs an in-process batched `generate`, as
   benchmarks/rollout.py measures it on CPU.
Prints a table, then one JSON line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROWS, PROMPT_TOKENS, RESPONSE_TOKENS = 256, 12, 8


def one_step(model, optimizer, device: torch.device) -> float:
    """One GRPO-shaped optimizer step (token log-probs, PPO-clip loss, backward, AdamW) on random tokens of
    the default run's shape; returns the loss. Device-agnostic, so a CPU test runs it too."""
    from miles.backends.logprobs import stats_from_logits
    from miles.backends.loss import ppo_clip_loss, sample_mean

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (ROWS, PROMPT_TOKENS + RESPONSE_TOKENS), generator=generator)
    mask = torch.zeros(ROWS, PROMPT_TOKENS + RESPONSE_TOKENS - 1)
    mask[:, PROMPT_TOKENS - 1:] = 1.0  # the response tokens carry the loss
    advantages = torch.randn(ROWS, 1, generator=generator).expand_as(mask)
    ids, mask, advantages = ids.to(device), mask.to(device), advantages.to(device)
    stats = stats_from_logits(model(input_ids=ids).logits, ids, temperature=1.0)
    old = stats.log_probs.detach()
    loss = sample_mean(ppo_clip_loss(stats.log_probs, old, advantages, 0.2, 0.2).pg_losses, mask).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def training_step(model_dir: str, out: Path) -> dict:
    from transformers import AutoModelForCausalLM

    from miles.backends.ppo import build_optimizer
    from miles.config import TrainConfig

    device = torch.device("cuda")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).train()
    optimizer = build_optimizer(model.parameters(), TrainConfig())
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = one_step(model, optimizer, device)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        snapshot = out / "cuda_memory_snapshot.pickle"
        torch.cuda.memory._dump_snapshot(str(snapshot))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return {"train_step_s": round(seconds, 4), "train_loss": round(loss, 6),
            "peak_allocated_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1),
            "memory_snapshot": str(snapshot), "snapshot_bytes": snapshot.stat().st_size}


def engine_and_rollout(model_dir: str) -> dict:
    import httpx

    from benchmarks.rollout import concurrent_requests, in_process_seconds, rollout_seconds
    from miles.config import EngineConfig, RolloutConfig, RouterConfig
    from miles.engines.launch import launch_engine
    from miles.rollout.data import read_prompts
    from miles.rollout.generate import encode_prompt
    from miles.router.launch import launch_router
    from miles.tiny.warmstart import default_task_data
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rollout = RolloutConfig()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = read_prompts(default_task_data()[0], "prompt", "label")[:rollout.rollout_batch_size]
    prompt_ids = [encode_prompt(tokenizer, p.prompt, False) for p in prompts]
    long = [{"input_ids": prompt_ids[i % len(prompt_ids)], "sampling_params": {
        "max_new_tokens": 64, "temperature": 1.0, "ignore_eos": True, "seed": i}} for i in range(64)]
    with launch_engine(model_dir, EngineConfig(engine_device="cuda")) as engine, \
            launch_router(RouterConfig(), worker_urls=[engine.url]) as router:
        device = httpx.get(engine.url + "/get_server_info").json()["device"]
        if not device.startswith("cuda"):
            raise RuntimeError(f"the engine asked for cuda serves on {device}")
        asyncio.run(concurrent_requests(engine.url, long[:8], 8))  # warm-up (CUDA context, kernels)
        seconds, tokens = asyncio.run(concurrent_requests(engine.url, long, 64))
        rollout_seconds(router.url, prompts, tokenizer, rollout, 0)
        via_router = min(rollout_seconds(router.url, prompts, tokenizer, rollout, i + 1)[0] for i in range(3))
    model = AutoModelForCausalLM.from_pretrained(model_dir).to("cuda").eval()
    cuda_ids = [ids for ids in prompt_ids for _ in range(rollout.n_samples_per_prompt)]
    limit = min(_cuda_generate(model, tokenizer, cuda_ids, rollout.rollout_max_response_len) for _ in range(4))
    return {"engine_device": device, "engine_tokens_per_s": round(tokens / seconds, 1),
            "rollout_router_s": round(via_router, 4), "rollout_in_process_s": round(limit, 4),
            "rollout_vs_in_process": round(via_router / limit, 3)}


def _cuda_generate(model, tokenizer, prompt_ids, max_new_tokens) -> float:
    from benchmarks.rollout import left_padded

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids, mask = left_padded(prompt_ids, pad)
    ids, mask = ids.to("cuda"), mask.to("cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                       max_new_tokens=max_new_tokens, pad_token_id=pad)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu-check", help="folder for the CUDA memory snapshot")
    parser.add_argument("--model", default=None, help="HF checkpoint (default: the tiny base model)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: skipped: no CUDA device is available here (torch.cuda.is_available() is False)")
        print(json.dumps({"skipped": True, "reason": "no CUDA device"}))
        return 0
    from miles.tiny.warmstart import ensure_base_model

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = args.model or str(ensure_base_model(progress=False))
    figures = {"gpu": torch.cuda.get_device_name(0), **training_step(model_dir, out), **engine_and_rollout(model_dir)}
    print(f"{'figure':<28}{'value':>40}")
    for key, value in figures.items():
        print(f"{key:<28}{str(value):>40}")
    print(json.dumps({"skipped": False, **figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
