"""The tiny policy is an ordinary HF checkpoint; the task data is Miles' JSONL format."""
from __future__ import annotations

import json

from transformers import AutoModelForCausalLM, AutoTokenizer

from miles.tiny.task import EVAL_SIZE, all_problems, split_problems, write_task_data
from miles.tiny.tokenizer import build_tokenizer
from miles.tiny.warmstart import ensure_base_model


def test_tokenizer_is_character_level_and_round_trips():
    tok = build_tokenizer()
    text = "37+58=95 x\n"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "1+2="}], add_generation_prompt=True)
    assert chat["input_ids"][0] == tok.convert_tokens_to_ids("<|im_start|>")  # a special token, not 12 chars


def test_task_split_is_disjoint_and_seeded(tmp_path):
    train, evals = split_problems(0)
    assert len(evals) == EVAL_SIZE and len(train) + len(evals) == len(all_problems())
    assert not {p.prompt for p in train} & {p.prompt for p in evals}
    assert split_problems(0) == (train, evals)
    train_path, eval_path = write_task_data(tmp_path)
    first = json.loads(train_path.read_text().splitlines()[0])
    a, b = first["prompt"].rstrip("=").split("+")
    assert first["label"] == str(int(a) + int(b))
    assert len(eval_path.read_text().splitlines()) == EVAL_SIZE


def test_base_model_loads_with_auto_classes():
    path = ensure_base_model(progress=False)
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.model_type == "qwen3"
    assert tok.eos_token == "<|im_end|>"
    assert (path / "chat_template.jinja").exists() or "chat_template" in (path / "tokenizer_config.json").read_text()
    report = json.loads((path / "warmstart.json").read_text())
    assert 0.10 <= report["eval_pass_at_1"] <= 0.60
    assert report["eval_greedy_accuracy"] >= 0.85  # capable but uncertain: the gap RL closes


def test_every_task_splits_by_the_one_held_out_rule():
    """The addition, multiplication and chat tasks share `held_out` (each had its own copy); the splits are
    the seeded shuffle they always were, so cached task files and models stay valid."""
    import random

    from miles.pretrained import chat_task
    from miles.tiny import tool_task
    from miles.tiny.task import held_out

    for module in (tool_task, chat_task):
        problems = module.all_problems()
        random.Random(3).shuffle(problems)
        assert held_out(module.all_problems(), 3, module.EVAL_SIZE) == (problems[:-module.EVAL_SIZE],
                                                                         problems[-module.EVAL_SIZE:])
    assert tool_task.split_problems(0) == held_out(tool_task.all_problems(), 0, tool_task.EVAL_SIZE)
    problems = all_problems()
    assert held_out(problems, 1, 10)[1] == held_out(problems, 1, 10)[1] and problems == all_problems()  # no side effect
