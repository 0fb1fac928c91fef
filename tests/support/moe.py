"""The MoE policy of the R3 tests: the tiny Qwen3-MoE with its router's weights scaled down (a
near-uniform router, as early in training: near-ties are common, so an engine in bfloat16 and a
trainer in float32 route some tokens differently) and its experts' scaled up tenfold (freshly
initialised experts are so alike that which one a token goes to hardly changes its log-prob;
trained ones differ). `engine_rollout`: its samples as the embedded engine serves them in bfloat16,
each with the experts the engine routed every token to."""
from __future__ import annotations

from pathlib import Path

import torch

from miles.engines import routing_capture as wire
from miles.engines.metrics import EngineMetrics
from miles.engines.model_runner import ModelRunner
from miles.engines.scheduler import Scheduler
from miles.rollout.routed_experts import read_routed_experts
from miles.rollout.sample import Sample
from tests.support.in_process_engine import Tracked, params, prompt

ROUTER_SCALE = 0.1
EXPERT_SCALE = 10.0


def moe_checkpoint(out: Path) -> Path:
    from miles.tiny.moe_model import build_tiny_moe_model
    from miles.tiny.warmstart import save_checkpoint

    model, tokenizer = build_tiny_moe_model(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".experts." in name:
                p.mul_(EXPERT_SCALE)
            elif name.endswith("mlp.gate.weight"):
                p.mul_(ROUTER_SCALE)
    save_checkpoint(model, tokenizer, out)
    return out


def engine_rollout(model_dir: Path, prompts: list[str], per_prompt: int,
                   dtype: str = "bfloat16") -> list[Sample]:
    """The engine's samples (10 new tokens each) with their routed experts, encoded and read back
    as on the wire; request j of prompt g samples with seed g * 8 + j."""
    runner = ModelRunner(model_dir, device="cpu", dtype=dtype)
    scheduler = Scheduler(runner, EngineMetrics(model_name="r3"), max_batch_size=8, max_queued=64)
    scheduler.start()
    try:
        tracked = []
        for g, text in enumerate(prompts):
            for j in range(per_prompt):
                ids = prompt(runner, text)
                t = Tracked(scheduler, f"r{g}-{j}", ids, params(10, seed=g * 8 + j))
                t.request.return_routed_experts = True
                tracked.append((g, text, t.submit()))
        samples = []
        for i, (g, text, t) in enumerate(tracked):
            r = t.result()
            record = read_routed_experts(wire.encode(r.routed_experts))
            samples.append(Sample(index=i, group_index=g, prompt=text, label=None,
                                  tokens=r.prompt_ids + r.output_ids,
                                  response_length=len(r.output_ids),
                                  rollout_log_probs=list(r.output_logprobs), routed_experts=record))
        return samples
    finally:
        scheduler.stop()
