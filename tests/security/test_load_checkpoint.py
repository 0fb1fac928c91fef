"""D5: `--load RUN/checkpoints/iter_N` (one checkpoint) is resumed from, not silently ignored; an --load that
holds nothing to resume from is a one-line error naming the flag before anything starts."""
from __future__ import annotations

import pytest

from miles.config import ConfigError
from miles.prepare import prepare
from miles.run import checkpoint as ckpt
from tests.support.checkpoints import save


def test_one_named_checkpoint_is_the_one_resumed(tmp_path):
    other = tmp_path / "other" / "checkpoints"
    save(other, 1)
    newest = save(other, 3)
    older = other / "iter_0000001"
    scan = ckpt.latest_good(older)
    assert scan.path == older and scan.state.rollout_id == 1  # not the newest beside it, not none
    run_save = tmp_path / "run" / "checkpoints"
    assert ckpt.resume_point(run_save, older).path == older  # a fresh run dir: the --load checkpoint
    own = save(run_save, 5)
    assert ckpt.resume_point(run_save, older).path == own  # the run's own progress past it wins
    assert ckpt.resume_point(run_save, newest).path == own
    (newest / "model.safetensors").write_bytes(b"weightz")
    damaged = ckpt.latest_good(newest)
    assert damaged.path is None and "checksum mismatch" in damaged.rejected[0].reason


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "nowhere", "does not exist or is not a directory"),
    (lambda d: (d / "empty").mkdir() or d / "empty", "holds no checkpoint .iter_NNNNNNN directories."),
    (lambda d: d / "iter_0000009", "does not exist or is not a directory"),
])
def test_an_explicit_load_with_nothing_to_resume_is_refused(tmp_path, make, message):
    load = make(tmp_path)
    with pytest.raises(ConfigError, match=message) as raised:
        prepare(["--run-dir", str(tmp_path / "run"), "--load", str(load)], make_model=False)
    assert str(raised.value).startswith("--load")


def test_a_damaged_named_checkpoint_is_refused_and_a_good_one_accepted(tmp_path):
    path = save(tmp_path / "ckpts", 2)
    config = prepare(["--run-dir", str(tmp_path / "run"), "--load", str(path)], make_model=False)
    assert config.train.load == str(path)
    (path / "model.safetensors").write_bytes(b"w")
    with pytest.raises(ConfigError, match="is not a usable checkpoint: model.safetensors has 1 bytes"):
        prepare(["--run-dir", str(tmp_path / "run"), "--load", str(path)], make_model=False)
