"""The warm start of the multi-turn task: a short SFT on demonstrations of the calculator format.

Half the demonstrations call the tool, the rest answer the product at once, which a two-layer
model mostly cannot. The skill (write the call, copy the answer from the observation) is
learnt from every tool demonstration, but the decision to call is labelled on only some of
them, so that a `call_share` (30%) of first-token labels open a tool call. The warm-started
policy therefore knows the format but uses the tool only sometimes: RL has to discover that
the tool pays. Observation tokens are outside the SFT loss, as in RL. Cached by recipe
beside the single-turn base model (`tiny-tool-base-<id>`).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F

from miles.rollout.tool_calls import TOOL_CALL, TOOL_CALL_END
from miles.tiny import tool_task
from miles.tiny.model import build_tiny_model
from miles.tiny.task import Problem
from miles.tiny.recipes import TOOL, tool_model_dir, tool_task_data, tool_task_dir  # noqa: F401 (named here too)
from miles.tiny.sft import Check, one_thread, token_ids, train_until
from miles.tiny.warmstart import ensure_cached, save_checkpoint

RECIPE = TOOL
# P(a tool row labels its first token) so that call_share of all first-token labels are the call:
# tool_rows * q / (tool_rows * q + 1 - tool_rows) = call_share.
DECISION_LABEL_P = (RECIPE["call_share"] / (1 - RECIPE["call_share"])) * (1 - RECIPE["tool_rows"]) / RECIPE["tool_rows"]


def ensure_tool_model(progress: bool = True) -> Path:
    """The cached warm-started checkpoint of the multi-turn task, made first if missing."""
    tool_task_data()
    return ensure_cached(tool_model_dir(), lambda out, show: warm_start(out, progress=show), progress)


def _encode(tokenizer, problems: list[Problem], use_tool: list[bool], label_decision: list[bool] | None,
            ids_of):
    """Right-padded (B, T) ids, attention mask, and labels on the trained pieces (and EOS) only; a tool
    row's first response token (the decision to call) is labelled only where `label_decision` says (`ids_of`:
    the remembered ids of `token_ids(tokenizer)`)."""
    rows = []
    for r, (problem, tool) in enumerate(zip(problems, use_tool)):
        ids = list(ids_of(problem.prompt))
        labels = [-100] * len(ids)
        for text, trained in tool_task.demonstration(problem, tool):
            piece = ids_of(text)
            ids += piece
            labels += piece if trained else [-100] * len(piece)
        if tool and label_decision is not None and not label_decision[r]:
            labels[len(ids_of(problem.prompt))] = -100
        ids.append(tokenizer.eos_token_id)
        labels.append(tokenizer.eos_token_id)
        rows.append((ids, labels))
    width = max(len(ids) for ids, _ in rows)
    out = torch.full((len(rows), width), tokenizer.pad_token_id)
    mask, target = torch.zeros_like(out), torch.full_like(out, -100)
    for i, (ids, labels) in enumerate(rows):
        out[i, : len(ids)], mask[i, : len(ids)], target[i, : len(ids)] = (torch.tensor(ids), 1,
                                                                          torch.tensor(labels))
    return out, mask, target


@torch.no_grad()
def _greedy(model, tokenizer, prefixes: list[str], max_new_tokens: int) -> list[str]:
    tokenizer.padding_side = "left"
    batch = tokenizer(prefixes, return_tensors="pt", padding=True)
    out = model.generate(**batch, do_sample=False, max_new_tokens=max_new_tokens,
                         pad_token_id=tokenizer.pad_token_id)
    tokenizer.padding_side = "right"
    return tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)


@torch.no_grad()
def evaluate_format(model, tokenizer, problems: list[Problem]) -> dict[str, float]:
    """How often the first sampled token opens a tool call (its mean probability), and whether the
    greedy tool path is right: the call written correctly, and the answer copied from the observation."""
    model.eval()
    tokenizer.padding_side = "left"
    batch = tokenizer([p.prompt for p in problems], return_tensors="pt", padding=True)
    logits = model(**batch).logits[:, -1]
    p_tool = torch.softmax(logits, -1)[:, tokenizer.convert_tokens_to_ids(TOOL_CALL)].mean().item()
    calls = _greedy(model, tokenizer, [p.prompt + TOOL_CALL for p in problems], 12)
    calls_ok = [c.split(TOOL_CALL_END)[0] == tool_task.tool_turn(p)[len(TOOL_CALL):-len(TOOL_CALL_END)]
                for c, p in zip(calls, problems)]
    answers = _greedy(model, tokenizer, [p.prompt + tool_task.tool_turn(p) + tool_task.observation(p)
                                         for p in problems], 6)
    answers_ok = [a.strip() == p.label for a, p in zip(answers, problems)]
    model.train()
    both = sum(c and a for c, a in zip(calls_ok, answers_ok)) / len(problems)
    return dict(tool_call_probability=round(p_tool, 4), tool_path_greedy_accuracy=round(both, 4),
                call_greedy_accuracy=round(sum(calls_ok) / len(problems), 4),
                answer_greedy_accuracy=round(sum(answers_ok) / len(problems), 4))


def warm_start(out_dir: Path, progress: bool = True) -> dict:
    """SFT on mixed demonstrations until the greedy tool path is right on held-out problems."""
    with one_thread():
        return _warm_start(out_dir, progress)


def _warm_start(out_dir: Path, progress: bool) -> dict:
    seed = RECIPE["seed"]
    train, evals = tool_task.split_problems(seed)
    evals = evals[: RECIPE["eval_prompts"]]
    model, tokenizer = build_tiny_model(seed, tool_markers=True)
    ids_of = token_ids(tokenizer)
    start, report, history = time.time(), {}, []

    def batch_loss(generator: torch.Generator) -> torch.Tensor:
        idx = torch.randint(len(train), (RECIPE["batch_size"],), generator=generator)
        use_tool = (torch.rand(RECIPE["batch_size"], generator=generator) < RECIPE["tool_rows"])
        decide = (torch.rand(RECIPE["batch_size"], generator=generator) < DECISION_LABEL_P)
        problems = [train[i] for i in idx]
        ids, mask, labels = _encode(tokenizer, problems, use_tool.tolist(), decide.tolist(), ids_of)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]  # (B, T-1, V)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                               ignore_index=-100)

    def check(step: int) -> Check:
        nonlocal report
        report = evaluate_format(model, tokenizer, evals)
        history.append(dict(step=step, **report))
        reached = report["tool_path_greedy_accuracy"]
        said = (f"warm start step {step}/{RECIPE['max_steps']}: held-out tool path {reached:.2f} "
                f"(target {RECIPE['target_tool_path']})")
        return Check(said, reached >= RECIPE["target_tool_path"])

    step = train_until(model, batch_loss, check, RECIPE, "warm start (tool SFT)", progress)
    save_checkpoint(model, tokenizer, out_dir)
    return dict(recipe=RECIPE, steps=step, **report, seconds=round(time.time() - start, 1), history=history)
