"""A short, deterministic supervised warm start that makes the tiny base checkpoint.

The SFT loss uses label smoothing, so the policy learns the addition algorithm (its
greedy answer is usually right on held-out problems) while its sampling distribution
stays wide: a temperature-1 sample is right only sometimes. That is the gap RL
post-training closes in practice, sharpening a capable but uncertain policy, and it
leaves GRPO something real to learn. Training stops when held-out greedy accuracy
reaches TARGET_GREEDY; the sampled pass@1 is recorded with the checkpoint. The result
is cached by recipe; `miles base-model` prints its path.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from miles.config.cache import cache_root
from miles.record.files import file_lock
from miles.tiny.model import build_tiny_model
from miles.tiny.sft import Check, one_thread, token_ids, train_until
from miles.tiny.recipes import ADDITION, base_model_dir, default_task_data, task_data_dir  # noqa: F401 (named here too: their callers import them from here)
from miles.tiny.recipes import ADDITION_MOE, moe_base_model_dir  # noqa: F401 (as above)
from miles.tiny.task import Problem, split_problems

RECIPE = ADDITION
TARGET_GREEDY = RECIPE["target_greedy"]


def ensure_cached(target: Path, make, progress: bool = True, marker: str = "warmstart.json") -> Path:
    """`target`, made first by `make(tmp_dir, progress) -> report` if missing; one maker at a time
    (a file lock), and atomic: a half-made model is never found under the real name (the report is
    written as `marker`, last)."""
    if (target / marker).exists():
        return target

    def waiting() -> None:
        if progress:
            print(f"[tiny] another process is making {target.name}; waiting for it (its lock: "
                  f"{cache_root() / f'.{target.name}.lock'})", flush=True)

    with file_lock(cache_root() / f".{target.name}.lock", on_wait=waiting):
        if (target / marker).exists():
            return target
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        report = make(tmp, progress)
        (tmp / marker).write_text(json.dumps(report, indent=2))
        shutil.rmtree(target, ignore_errors=True)  # a dir without its marker is a half-made one
        tmp.rename(target)
    return target


def save_checkpoint(model, tokenizer, out_dir: Path) -> None:
    """save_pretrained without transformers' "Writing model shards" bar (one shard of a tiny model: it
    only adds a line of noise to the first run's output)."""
    from transformers.utils import logging as hf_logging

    out_dir.mkdir(parents=True, exist_ok=True)
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out_dir, safe_serialization=True)
        tokenizer.save_pretrained(out_dir)
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def ensure_base_model(progress: bool = True) -> Path:
    """The cached base checkpoint directory, made first if missing (under 3 minutes on 2 cores)."""
    default_task_data()
    return ensure_cached(base_model_dir(), lambda out, show: warm_start(out, progress=show), progress)


def ensure_moe_base_model(progress: bool = True) -> Path:
    """The cached tiny mixture-of-experts base checkpoint (`ADDITION_MOE`), made first if
    missing."""
    default_task_data()
    return ensure_cached(moe_base_model_dir(),
                         lambda out, show: warm_start(out, progress=show, moe=True), progress)


def _encode(tokenizer, problems: list[Problem], ids_of) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (B, T) ids, attention mask, and labels that score only the answer and EOS (`ids_of`: the
    remembered ids of `token_ids(tokenizer)`)."""
    rows = []
    for p in problems:
        prompt = ids_of(p.prompt)
        answer = ids_of(p.label) + [tokenizer.eos_token_id]
        rows.append((prompt, answer))
    width = max(len(a) + len(b) for a, b in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (prompt, answer) in enumerate(rows):
        seq = prompt + answer
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
        labels[i, len(prompt): len(seq)] = torch.tensor(answer)
    return ids, mask, labels


@torch.no_grad()
def eval_accuracy(model, tokenizer, problems: list[Problem], sample: bool, seed: int = 0,
                  max_new_tokens: int = 6) -> float:
    """Exact-match rate of one answer per problem: greedy, or one temperature-1 sample."""
    model.eval()
    tokenizer.padding_side = "left"
    batch = tokenizer([p.prompt for p in problems], return_tensors="pt", padding=True)
    torch.manual_seed(seed)
    sampling = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0) if sample else dict(do_sample=False)
    out = model.generate(**batch, **sampling, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    model.train()
    tokenizer.padding_side = "right"
    return sum(t.strip() == p.label for t, p in zip(texts, problems)) / len(problems)


def smoothed_loss(model, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor,
                  router_aux_loss: bool = False) -> torch.Tensor:
    """Label-smoothed cross entropy on the answer tokens; with `router_aux_loss` (a
    mixture-of-experts model), plus the router's load-balancing loss at the model's
    `router_aux_loss_coef`."""
    routers = {"output_router_logits": True} if router_aux_loss else {}
    out = model(input_ids=ids, attention_mask=mask, **routers)
    logits = out.logits[:, :-1]  # (B, T-1, V) predicts tokens 1..T-1
    targets = labels[:, 1:]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=-100, label_smoothing=RECIPE["label_smoothing"])
    if router_aux_loss:
        loss = loss + model.config.router_aux_loss_coef * out.aux_loss
    return loss


def warm_start(out_dir: Path, progress: bool = True, moe: bool = False) -> dict:
    """Supervised training on the train split until held-out greedy accuracy reaches the target (the
    dense tiny policy, or with `moe` the tiny mixture-of-experts one)."""
    with one_thread():
        return _warm_start(out_dir, progress, ADDITION_MOE if moe else RECIPE)


def _build(recipe: dict):
    if recipe.get("policy") == "moe":
        from miles.tiny.moe_model import build_tiny_moe_model

        return build_tiny_moe_model(recipe["seed"])
    return build_tiny_model(recipe["seed"])


def _warm_start(out_dir: Path, progress: bool, recipe: dict) -> dict:
    seed, target = recipe["seed"], recipe["target_greedy"]
    train, evals = split_problems(seed)
    evals = evals[: recipe["eval_prompts"]]
    model, tokenizer = _build(recipe)
    ids_of = token_ids(tokenizer)
    start, greedy = time.time(), 0.0
    aux = bool(recipe.get("router_aux_loss"))

    def batch_loss(generator: torch.Generator) -> torch.Tensor:
        idx = torch.randint(len(train), (recipe["batch_size"],), generator=generator)
        return smoothed_loss(model, *_encode(tokenizer, [train[i] for i in idx], ids_of), aux)

    def check(step: int) -> Check:
        nonlocal greedy
        greedy = eval_accuracy(model, tokenizer, evals, sample=False)
        said = (f"warm start step {step}/{recipe['max_steps']}: held-out greedy accuracy "
                f"{greedy:.2f} (target {target})")
        return Check(said, greedy >= target, f"greedy={greedy:.2f}")

    label = "warm start (SFT, MoE)" if recipe.get("policy") == "moe" else "warm start (SFT)"
    step = train_until(model, batch_loss, check, recipe, label, progress, f"greedy={greedy:.2f}")
    sampled = eval_accuracy(model, tokenizer, evals, sample=True, seed=seed)
    save_checkpoint(model, tokenizer, out_dir)
    return dict(recipe=recipe, steps=step, eval_greedy_accuracy=greedy, eval_pass_at_1=sampled,
                seconds=round(time.time() - start, 1))
