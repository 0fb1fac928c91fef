"""Checkpoints: sealed atomically, verified by checksum, newest good one found past corrupt ones."""
import json

import pytest

from miles.run import checkpoint as ckpt
from tests.support.checkpoints import save


def test_seal_then_find(tmp_path):
    save(tmp_path, 1)
    path = save(tmp_path, 3)
    scan = ckpt.latest_good(tmp_path)
    assert scan.path == path and path.name == "iter_0000003" and scan.rejected == []
    assert scan.state.data_cursor == {"epoch": 0, "offset": 32} and scan.state.extra == {"wandb_run_id": "abc"}
    assert not list(tmp_path.glob(".staging-*"))


@pytest.mark.parametrize("damage,reason", [
    (lambda p: (p / "model.safetensors").write_bytes(b"weightz"), "checksum mismatch"),
    (lambda p: (p / "model.safetensors").write_bytes(b"w"), "has 1 bytes"),
    (lambda p: (p / "model.safetensors").unlink(), "missing file model.safetensors"),
    (lambda p: (p / "manifest.json").unlink(), "no manifest.json"),
    (lambda p: (p / "manifest.json").write_text("{"), "unreadable manifest.json"),
])
def test_corrupt_newest_falls_back_to_previous(tmp_path, damage, reason):
    good = save(tmp_path, 1)
    bad = save(tmp_path, 2)
    damage(bad)
    scan = ckpt.latest_good(tmp_path)
    assert scan.path == good
    assert [r.path for r in scan.rejected] == [bad] and reason in scan.rejected[0].reason


def test_half_written_staging_dir_is_never_a_candidate(tmp_path):
    good = save(tmp_path, 1)
    staged = ckpt.staging_dir(tmp_path, 2)  # a crash before seal() leaves only this
    (staged / "model.safetensors").write_bytes(b"partial")
    assert ckpt.latest_good(tmp_path).path == good


def test_no_checkpoint(tmp_path):
    scan = ckpt.latest_good(tmp_path / "nothing")
    assert scan.path is None and scan.state is None


def test_keep_prunes_old_and_resave_replaces(tmp_path):
    for r in range(4):
        save(tmp_path, r, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000002", "iter_0000003"]
    save(tmp_path, 3, payload=b"again", keep=2)  # a retried chunk saves the same iteration again
    assert (tmp_path / "iter_0000003" / "model.safetensors").read_bytes() == b"again"
    manifest = json.loads((tmp_path / "iter_0000003" / "manifest.json").read_text())
    assert set(manifest["files"]) == {"model.safetensors", "trainer_state.json"}
