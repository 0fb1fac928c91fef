"""A sealed checkpoint without a trainer: a stand-in weights file and a TrainerState, staged and
sealed by the same code a run uses, for tests of finding, rejecting and loading checkpoints."""
from __future__ import annotations

from miles.run import checkpoint as ckpt


def save(save_dir, rollout_id, payload=b"weights", keep=5):
    staged = ckpt.staging_dir(save_dir, rollout_id)
    (staged / "model.safetensors").write_bytes(payload)
    cursor = {"epoch": 0, "offset": 8 * (rollout_id + 1)}
    state = ckpt.TrainerState(rollout_id=rollout_id, weight_version=rollout_id + 1,
                              data_cursor=cursor, world_size=1, extra={"wandb_run_id": "abc"})
    return ckpt.seal(staged, save_dir, state, keep)
