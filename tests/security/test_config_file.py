"""Probes N42 and N43: a `--config` YAML file that is not UTF-8 was a UnicodeDecodeError traceback (exit 1);
a key given twice silently took the last value. Now each is one line naming --config, the file and what
is wrong, exit 2, before anything starts."""
from __future__ import annotations

import subprocess
import sys

import pytest

from miles.config import ConfigError, TrainConfig, parse_sections
from miles.config.parse import load_yaml


@pytest.mark.parametrize("data, byte", [(b"\xff\xfe", 0), (b"num-rollout: 2\n\xc3\x28: 1\n", 15)],
                         ids=["utf16-mark", "bad-continuation"])
def test_a_config_that_is_not_utf8_is_one_line(tmp_path, data, byte):
    path = tmp_path / "c.yaml"
    path.write_bytes(data)
    with pytest.raises(ConfigError, match=f"^--config: {path} is not UTF-8 text \\(byte {byte}: "):
        load_yaml(str(path))
    done = subprocess.run([sys.executable, "-m", "miles.train", "--config", str(path)], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [f"python -m miles.train: error: --config: {path} is not UTF-8 "
                                                f"text (byte {byte}: {data[byte:byte + 1]!r})"]


@pytest.mark.parametrize("text, words", [
    ("seed: 1\nseed: -1\n", "gives the key 'seed' twice (lines 1 and 2)"),
    ("num-rollout: 2\nlr: 0.1\nnum-rollout: 3\n", "gives the key 'num-rollout' twice (lines 1 and 3)"),
    ("{seed: 1, seed: 2}\n", "gives the key 'seed' twice (lines 1 and 1)"),
    ("num-rollout: 2\nnum_rollout: 3\n", "gives 'num-rollout' and 'num_rollout', which name one flag (--num-rollout)"),
], ids=["twice", "apart", "flow", "two-spellings"])
def test_a_key_given_twice_is_one_line_naming_it(tmp_path, text, words):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        parse_sections([TrainConfig], ["--config", str(path)])
    assert str(caught.value).startswith(f"--config: {path} {words}"), caught.value


def test_a_plain_config_still_reads(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("num-rollout: 3\n--seed: 7\nlr: 1.0e-5\n")
    assert load_yaml(str(path)) == {"num_rollout": 3, "seed": 7, "lr": 1e-5}
    path.write_text("")
    assert load_yaml(str(path)) == {}
    path.write_text("- a\n")
    with pytest.raises(ConfigError, match="must hold a mapping of flag names to values"):
        load_yaml(str(path))
