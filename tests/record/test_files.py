"""`miles.record.files`: the one whole-file writer, the one file lock and the one file digest (each
had copies: ten tmp-then-rename writers, two of them hardened against a planted link and the shared
one not; two flock context managers; a checkpoint's manifest and a made model's wheel hashed by the
same loop twice)."""
from __future__ import annotations

import fcntl
import gzip
import hashlib
import os
import re
import tempfile
from pathlib import Path

import pytest

from miles.record.files import (BLOCK, file_lock, file_sha256, replacing, write_atomic,
                                write_bytes_atomic, write_gzip_atomic, write_jsonl)

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


# whole-file renames that are not one file written: a model directory, a checkpoint rename
NOT_ONE_FILE = {"miles/tiny/warmstart.py", "miles/run/checkpoint.py"}


def test_files_are_written_whole_in_one_place():
    """Ten writers had their own tmp-then-rename (samples, eval prompts, tokens, the tiny task's
    data, the tracking state, services.json, processes.json, a profiler trace, a trusted record, a
    diagnose bundle)."""
    renames = re.compile(r"os\.replace\(|os\.rename\(|\.replace\(path\)|tmp\.replace\("
                         r"|tmp\.rename\(|mkstemp\(")
    writers = {str(path.relative_to(ROOT)) for folder in ("miles", "flows", "tasks", "benchmarks")
               for path in (ROOT / folder).rglob("*.py") if renames.search(path.read_text())}
    assert writers - NOT_ONE_FILE == {"miles/record/files.py"}


def plausible_temp_names(name: str) -> list[str]:
    """The names a tmp-then-rename writer of `name` might pick: fixed, per process, hidden."""
    pid = os.getpid()
    return [f"{name}.tmp", f"{name}.{pid}.tmp", f"{name}.tmp{pid}", f".{name}.tmp",
            f".{name}.{pid}.tmp", f"{Path(name).stem}.tmp", f".{Path(name).stem}.tmp"]


WRITERS = {"text": lambda p: write_atomic(p, "new\n"),
           "bytes": lambda p: write_bytes_atomic(p, b"new\n"),
           "gzip": lambda p: write_gzip_atomic(p, b"new\n"), "jsonl": lambda p: write_jsonl(p, [1])}


@pytest.mark.parametrize("write", WRITERS.values(), ids=WRITERS.keys())
def test_a_planted_link_at_a_temporary_name_is_never_written_through(tmp_path, write):
    """Probe N37 for every writer: a symlink planted where the temporary file might go, pointing
    outside (the shared writer wrote through `<name>.<pid>.tmp`)."""
    folder, victim = tmp_path / "run", tmp_path / "victim"
    folder.mkdir()
    victim.write_text("keep\n")
    names = plausible_temp_names("state.json")
    for name in names:
        (folder / name).symlink_to(victim)
    write(folder / "state.json")
    assert victim.read_text() == "keep\n"
    assert not (folder / "state.json").is_symlink()
    left = sorted(p.name for p in folder.iterdir())
    assert left == sorted(names + ["state.json"])  # and no temporary file left


def test_the_temporary_name_is_fresh_even_when_the_random_one_is_planted(tmp_path, monkeypatch):
    """The temporary file is created exclusively (O_EXCL): a link planted at the very name drawn is
    skipped, not opened (mkstemp draws the next name)."""
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (tmp_path / ".state.json.planted.tmp").symlink_to(victim)
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: iter(["planted", "fresh"]))
    write_atomic(tmp_path / "state.json", "new\n")
    assert victim.read_text() == "keep\n" and (tmp_path / "state.json").read_text() == "new\n"


def test_bytes_and_gzip_round_trip_with_the_permissions_of_a_plain_write(tmp_path):
    data = bytes(range(256)) * 40 + "é\n".encode()
    assert write_bytes_atomic(tmp_path / "a.bin", data).read_bytes() == data
    packed = write_gzip_atomic(tmp_path / "t.json.gz", data)
    assert gzip.decompress(packed.read_bytes()) == data
    with gzip.open(packed) as f:
        assert f.read() == data
    assert gzip.decompress(write_gzip_atomic(tmp_path / "s.gz", "é").read_bytes()) == "é".encode()
    old = os.umask(0o027)
    try:
        plain = tmp_path / "plain"
        plain.write_text("")
        written = write_atomic(tmp_path / "w", "x")
        assert written.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old)
    assert write_atomic(tmp_path / "record", "x", mode=0o644).stat().st_mode & 0o777 == 0o644
    assert write_bytes_atomic(tmp_path / "bundle", b"x", mode=0o600).stat().st_mode & 0o777 == 0o600


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = write_atomic(tmp_path / "trace.json", "old")
    with pytest.raises(RuntimeError), replacing(path) as f:
        f.write(b"half")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["trace.json"]


class Held(Exception):
    pass


def held() -> None:
    raise Held


def test_the_lock_excludes_a_second_holder(tmp_path):
    path = tmp_path / "cache" / ".model.lock"  # its folder is made
    with file_lock(path):
        with open(path) as other, pytest.raises(BlockingIOError):  # another open file, as another
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)       # process's would be: refused
        with pytest.raises(Held), file_lock(path, on_wait=held):  # told before it would wait
            pass
    with file_lock(path, on_wait=held):  # free again: taken without waiting
        with open(path) as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
