"""`RUN_DIR/samples/eval/`: one row per eval prompt (its samples' rewards and pass rate), read back by step."""
from __future__ import annotations

from types import SimpleNamespace

from miles.record.eval_prompts import eval_prompts_path, read_eval_prompts, write_eval_prompts


def sample(group, prompt, reward):
    return SimpleNamespace(group_index=group, prompt=prompt, label=str(group), reward=reward,
                           response=f" {group + 1}")


def test_rows_per_prompt_and_the_later_eval_at_a_step_wins(tmp_path):
    data = {"arith": {"samples": [sample(0, "1+1=", 1.0), sample(1, "2+2=", 0.0), sample(0, "1+1=", 0.0),
                                  sample(1, "2+2=", 0.0)]}}
    path = write_eval_prompts(tmp_path, -1, 0, data)
    assert path == eval_prompts_path(tmp_path, -1) and path.name == "base.jsonl"
    rows = read_eval_prompts(tmp_path)[0]
    assert [(r["prompt"], r["rewards"], r["pass_rate"]) for r in rows] == [("1+1=", [1.0, 0.0], 0.5),
                                                                          ("2+2=", [0.0, 0.0], 0.0)]
    data["arith"]["samples"][1].reward = 1.0
    write_eval_prompts(tmp_path, 0, 0, data)  # an eval at rollout 0 is eval step 0 too: it wins over the base
    assert [r["pass_rate"] for r in read_eval_prompts(tmp_path)[0]] == [0.5, 0.5]
    assert write_eval_prompts(tmp_path, 3, 3, {"arith": {"rewards": [1]}}) is None  # no samples: no file
    assert set(read_eval_prompts(tmp_path)) == {0}
