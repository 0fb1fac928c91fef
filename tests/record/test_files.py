"""`miles.record.files`: the one file digest (a checkpoint's manifest and a made model's wheel were hashed
by two copies of the same loop)."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

from miles.record.files import BLOCK, file_sha256

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
