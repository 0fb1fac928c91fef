"""`miles.record.files`: the one whole-file writer and the one file digest (each had copies: seven
tmp-then-rename writers; a checkpoint's manifest and a made model's wheel hashed by the same loop twice)."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from miles.record.files import BLOCK, file_sha256, write_atomic, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def test_the_digest_is_sha256_of_the_whole_file_across_blocks(tmp_path):
    data = bytes(range(256)) * (BLOCK // 256 * 2 + 7)  # more than two blocks, the last one short
    path = tmp_path / "weights.bin"
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert file_sha256(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()


def test_it_is_the_only_file_hashing_loop():
    loops = [f"{path.relative_to(ROOT)}" for folder in ("miles", "flows", "tasks", "benchmarks")
             for path in (ROOT / folder).rglob("*.py") if re.search(r"iter\(lambda: \w+\.read\(", path.read_text())]
    assert loops == ["miles/record/files.py"]


def test_a_file_is_written_whole_or_left_as_it_was(tmp_path):
    path = tmp_path / "samples" / "rollout_000001.jsonl"
    write_jsonl(path, [{"a": 1}, {"b": [2, 3]}])  # the folder is made
    assert path.read_text() == '{"a": 1}\n{"b": [2, 3]}\n'
    write_jsonl(path, [{"a": 1}], separators=(",", ":"))
    assert path.read_text() == '{"a":1}\n'
    with pytest.raises(TypeError):
        write_jsonl(path, [{"ok": 1}, {"bad": object()}])  # a row that cannot be written: the old file stays
    assert path.read_text() == '{"a":1}\n'
    write_atomic(tmp_path / "state.json", "{}")
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["rollout_000001.jsonl", "state.json"]


# whole-file writes that are not one text file: a gzip trace, a zip bundle, a model directory, a checkpoint
# rename; and compare/'s trusted record (its owners change compare/ apart)
NOT_TEXT = {"miles/profiling/summary.py", "miles/diagnose/bundle.py", "miles/tiny/warmstart.py",
            "miles/run/checkpoint.py", "miles/compare/trusted.py"}


def test_text_files_are_written_whole_in_one_place():
    """Seven writers had their own tmp-then-rename (samples, eval prompts, tokens, the tiny task's data,
    the tracking state, services.json, processes.json)."""
    renames = re.compile(r"os\.replace\(|os\.rename\(|\.replace\(path\)|tmp\.replace\(|tmp\.rename\(")
    writers = {str(path.relative_to(ROOT)) for folder in ("miles", "flows", "tasks", "benchmarks")
               for path in (ROOT / folder).rglob("*.py") if renames.search(path.read_text())}
    assert writers - NOT_TEXT == {"miles/record/files.py"}
