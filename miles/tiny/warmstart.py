"""A short, deterministic supervised warm start that makes the tiny base checkpoint.

Training stops as soon as the sampled pass@1 on the eval set reaches TARGET_PASS_AT_1,
so RL starts from a policy that is right sometimes but far from always: there is
something to learn. The result is cached by recipe; `miles base-model` prints its path.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from miles.tiny.model import build_tiny_model
from miles.tiny.task import Problem, split_problems, write_task_data

RECIPE = dict(version=1, seed=0, lr=3e-3, batch_size=64, max_steps=3000, eval_every=100,
              target_pass_at_1=0.25, eval_prompts=256)
TARGET_PASS_AT_1 = RECIPE["target_pass_at_1"]


def cache_root() -> Path:
    return Path(os.environ.get("MILES_CACHE_DIR", Path.home() / ".cache" / "miles"))


def recipe_id() -> str:
    return hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:10]


def task_data_dir() -> Path:
    return cache_root() / "tiny-task"


def default_task_data() -> tuple[Path, Path]:
    """The arithmetic train and eval JSONL files (written on first use)."""
    return write_task_data(task_data_dir(), seed=RECIPE["seed"])


def base_model_dir() -> Path:
    return cache_root() / f"tiny-base-{recipe_id()}"


@contextmanager
def _lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_base_model(progress: bool = True) -> Path:
    """The cached base checkpoint directory, made first if missing (under 3 minutes on 2 cores)."""
    target = base_model_dir()
    if (target / "warmstart.json").exists():
        return target
    with _lock(cache_root() / f".{target.name}.lock"):
        if (target / "warmstart.json").exists():
            return target
        default_task_data()
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        report = warm_start(tmp, progress=progress)
        (tmp / "warmstart.json").write_text(json.dumps(report, indent=2))
        tmp.rename(target)  # atomic: a half-made model is never found under the real name
    return target


def _encode(tokenizer, problems: list[Problem]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (B, T) ids, attention mask, and labels that score only the answer and EOS."""
    rows = []
    for p in problems:
        prompt = tokenizer(p.prompt)["input_ids"]
        answer = tokenizer(p.label)["input_ids"] + [tokenizer.eos_token_id]
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
def sampled_pass_at_1(model, tokenizer, problems: list[Problem], seed: int, max_new_tokens: int = 6) -> float:
    """Mean exact-match of one temperature-1 sample per problem."""
    model.eval()
    tokenizer.padding_side = "left"
    batch = tokenizer([p.prompt for p in problems], return_tensors="pt", padding=True)
    torch.manual_seed(seed)
    out = model.generate(**batch, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                         max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    model.train()
    return sum(t.strip() == p.label for t, p in zip(texts, problems)) / len(problems)


def warm_start(out_dir: Path, progress: bool = True) -> dict:
    """Supervised training on the train split until sampled pass@1 reaches the target."""
    from rich.progress import Progress

    seed = RECIPE["seed"]
    train, evals = split_problems(seed)
    evals = evals[: RECIPE["eval_prompts"]]
    model, tokenizer = build_tiny_model(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=RECIPE["lr"], weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    start, pass_at_1, step = time.time(), 0.0, 0
    model.train()
    with Progress(disable=not progress, transient=True) as bar:
        job = bar.add_task("warm start (SFT)", total=RECIPE["max_steps"])
        for step in range(1, RECIPE["max_steps"] + 1):
            idx = torch.randint(len(train), (RECIPE["batch_size"],), generator=gen)
            ids, mask, labels = _encode(tokenizer, [train[i] for i in idx])
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            bar.update(job, advance=1, description=f"warm start (SFT) loss={loss.item():.3f} pass@1={pass_at_1:.2f}")
            if step % RECIPE["eval_every"] == 0:
                pass_at_1 = sampled_pass_at_1(model, tokenizer, evals, seed=seed + step)
                if pass_at_1 >= TARGET_PASS_AT_1:
                    break
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.padding_side = "right"
    tokenizer.save_pretrained(out_dir)
    return dict(recipe=RECIPE, steps=step, eval_pass_at_1=pass_at_1, seconds=round(time.time() - start, 1))
