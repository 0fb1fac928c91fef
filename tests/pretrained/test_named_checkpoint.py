"""A catalog name in --hf-checkpoint: accepted by the parser, resolved to its cache directory with its chat
task as the fallback data, and the chat prompts encoded through a real (tokenizers-backed) chat template."""
import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from miles.config import ConfigError, parse_config
from miles.config.checkpoints import CATALOG, checkpoint_dir, named
from miles.pretrained import fallback
from miles.pretrained.chat_task import all_problems
from miles.prepare import resolve_run
from miles.rollout.generate import encode_prompt
from miles.rollout.rewards import math_reward

NAME = "smollm2-135m-instruct"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MILES_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_name_parses_and_a_wrong_one_is_refused_naming_the_catalog():
    assert parse_config(["--hf-checkpoint", NAME]).rollout.hf_checkpoint == NAME
    with pytest.raises(ConfigError, match=f"path does not exist: smollm3 \\(nor one of the names: {NAME}\\)"):
        parse_config(["--hf-checkpoint", "smollm3"])


def test_a_local_directory_of_that_name_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert named(NAME) is CATALOG[NAME]
    (tmp_path / NAME).mkdir()
    assert named(NAME) is None


def test_resolve_names_the_cache_dir_and_the_chat_task_without_making_anything(cache, tmp_path):
    config = resolve_run(parse_config(["--hf-checkpoint", NAME, "--run-dir", str(tmp_path / "run")]))
    r = config.rollout
    assert r.hf_checkpoint == str(checkpoint_dir(CATALOG[NAME])) and r.hf_checkpoint.startswith(str(cache))
    assert r.prompt_data.endswith(f"{NAME}-task/train.jsonl")
    assert r.eval_prompt_data[0] == fallback.EVAL_NAME
    assert not cache.exists()  # resolve is pure
    assert fallback.model_missing(config) == checkpoint_dir(CATALOG[NAME])
    assert resolve_run(config) == config  # idempotent: the flow prepares again from the resolved config


def test_the_chat_task_is_deterministic_disjoint_and_verifiable(cache, tmp_path):
    config = resolve_run(parse_config(["--hf-checkpoint", NAME, "--run-dir", str(tmp_path / "run")]))
    fallback.make_task_data(config)
    train = [json.loads(line) for line in open(config.rollout.prompt_data)]
    evals = [json.loads(line) for line in open(config.rollout.eval_prompt_data[1])]
    assert len(train) + len(evals) == len(all_problems()) and len(evals) == 64
    assert not {p["prompt"] for p in train} & {p["prompt"] for p in evals}
    for p in train[:50]:
        a, op, b = p["prompt"].split("?")[0].removeprefix("What is ").split()
        assert int(p["label"]) == (int(a) + int(b) if op == "+" else int(a) - int(b))
        assert math_reward(f"so the answer is \\boxed{{{p['label']}}}", p["label"]) == 1.0
        assert math_reward("\\boxed{999}", p["label"]) == 0.0


def test_chat_prompts_encode_to_ids_with_a_real_fast_tokenizer():
    words = ["<|im_start|>", "<|im_end|>", "user", "assistant", "What", "is", "2", "+", "3", "?"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="<|im_end|>")
    tok.chat_template = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")
    ids = encode_prompt(tok, "What is 2 + 3 ?", apply_chat_template=True)
    assert all(isinstance(i, int) for i in ids)
    assert tok.convert_ids_to_tokens(ids) == ["<|im_start|>", "user", "What", "is", "2", "+", "3", "?",
                                              "<|im_end|>", "<|im_start|>", "assistant"]
