"""Review N31: `samples/eval/` held each held-out prompt's rewards but not what the model answered,
so the Evals view could say which prompts fail but not how. Each row keeps its samples' responses,
cut short."""
from __future__ import annotations

import json
from types import SimpleNamespace

from miles.record.eval_prompts import (RESPONSE_CHARS, eval_prompts_path, read_eval_prompts,
                                       write_eval_prompts)


def sample(group, response, reward):
    return SimpleNamespace(group_index=group, prompt=f"{group}+{group}=", label=str(2 * group),
                           reward=reward, response=response)


def test_each_prompt_keeps_its_answers_beside_their_rewards(tmp_path):
    long = "7" * (RESPONSE_CHARS + 50)
    samples = [sample(1, " 2", 1.0), sample(1, long, 0.0), sample(3, " 5", 0.0)]
    data = {"arith": {"samples": samples}}
    write_eval_prompts(tmp_path, 9, 9, data)
    rows = {r["prompt"]: r for r in read_eval_prompts(tmp_path)[9]}
    assert rows["1+1="]["responses"] == [" 2", "7" * RESPONSE_CHARS + "…"]
    assert rows["1+1="]["rewards"] == [1.0, 0.0]
    assert rows["3+3="]["responses"] == [" 5"]


def test_rows_without_answers_or_with_bad_ones_still_read(tmp_path):
    path = eval_prompts_path(tmp_path, 4)
    path.parent.mkdir(parents=True)
    base = {"eval_set": "arith", "eval_step": 4, "label": "2", "rewards": [0.0], "pass_rate": 0.0}
    rows = [{**base, "prompt": "old"}, {**base, "prompt": "bad", "responses": [1, None]},
            {**base, "prompt": "huge", "responses": ["x" * 10_000]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    read = {r["prompt"]: r for r in read_eval_prompts(tmp_path)[4]}
    assert "responses" not in read["old"] and "responses" not in read["bad"]
    assert len(read["huge"]["responses"][0]) == RESPONSE_CHARS + 1
