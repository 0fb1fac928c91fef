"""Prompt data: JSONL reading with clear errors, seeded epochs, a cursor that resumes exactly."""
import json

import pytest

from miles.config import ConfigError
from miles.rollout.data import DataSource, Prompt, read_prompts


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_read_prompts_with_custom_keys(tmp_path):
    path = write(tmp_path / "d.jsonl", [{"q": "1+1=", "a": 2}, {"q": "2+2="}])
    assert read_prompts(path, "q", "a") == [Prompt("1+1=", "2"), Prompt("2+2=", None)]


def test_read_prompts_errors_name_file_and_line(tmp_path):
    path = write(tmp_path / "d.jsonl", [{"prompt": "x"}, {"question": "y"}])
    with pytest.raises(ConfigError, match=r"d.jsonl:2 has no key 'prompt'") as err:
        read_prompts(path, "prompt", "label")
    assert err.value.flag == "--input-key"
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(ConfigError, match=r"bad.jsonl:1 is not JSON"):
        read_prompts(tmp_path / "bad.jsonl", "prompt", "label")
    with pytest.raises(ConfigError, match="does not exist"):
        read_prompts(tmp_path / "missing.jsonl", "prompt", "label")


def test_batches_cover_an_epoch_then_reshuffle():
    prompts = [Prompt(str(i), None) for i in range(10)]
    source = DataSource(prompts, seed=3)
    first_epoch = source.next_batch(4) + source.next_batch(4) + source.next_batch(2)
    assert sorted(p.prompt for p in first_epoch) == [str(i) for i in range(10)]
    assert source.state_dict() == {"epoch": 1, "offset": 0}
    second = source.next_batch(10)
    assert sorted(p.prompt for p in second) == sorted(p.prompt for p in first_epoch)
    assert second != first_epoch  # a new order each epoch


def test_cursor_resumes_the_same_stream():
    prompts = [Prompt(str(i), None) for i in range(7)]
    straight = DataSource(prompts, seed=1)
    expected = [straight.next_batch(3) for _ in range(5)]
    first = DataSource(prompts, seed=1)
    got = [first.next_batch(3) for _ in range(2)]
    resumed = DataSource(prompts, seed=1)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    got += [resumed.next_batch(3) for _ in range(3)]
    assert got == expected
