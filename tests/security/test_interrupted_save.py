"""Probe ASY3 (the rest): Ctrl-C that lands while a checkpoint is being written left only its
`.staging-*` dir behind. The checkpoint is now either sealed or never begun: the staging dir goes
with the interrupt."""
from __future__ import annotations

from pathlib import Path

import pytest

from miles.config import parse_config
from miles.prepare import prepare_config
from miles.run import checkpoint
from tests.support.fake_training import GENERATE, FakeGroup, fake_trainer


class InterruptedSave(FakeGroup):
    """Ranks that are interrupted (Ctrl-C) half-way through writing a checkpoint."""

    def call(self, method: str, *args):
        if method == "save":
            (Path(args[0]) / "model.safetensors").write_bytes(b"half")
            raise KeyboardInterrupt
        return super().call(method, *args)


def test_an_interrupted_save_leaves_no_staging_dir(tmp_path):
    config = prepare_config(parse_config(["--num-rollout", "2", "--run-dir", str(tmp_path / "run"),
                                          "--custom-generate-function-path", GENERATE]))
    trainer = fake_trainer(config)
    trainer.group = InterruptedSave(config.world_size)
    save = Path(config.train.save)
    try:
        trainer.run_iteration(0)
        with pytest.raises(KeyboardInterrupt):
            trainer.save_checkpoint(0)
    finally:
        trainer.close()
    assert not list(save.glob(f"{checkpoint.STAGING_PREFIX}*"))
    assert checkpoint.candidates(save) == []  # nothing sealed either


def test_a_failed_staging_is_removed_and_a_sealed_one_kept(tmp_path):
    with pytest.raises(OSError):
        with checkpoint.staging(tmp_path, 3) as staged:
            (staged / "optimizer.pt").write_bytes(b"x")
            raise OSError("disk full")
    assert list(tmp_path.iterdir()) == []
    with checkpoint.staging(tmp_path, 4) as staged:
        (staged / "optimizer.pt").write_bytes(b"x")
    assert staged.is_dir()  # no error: kept for seal()
