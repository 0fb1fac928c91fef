"""Sample-generation tables: `RUN_DIR/samples/rollout_<id>.jsonl`, one row per sample,
written every `--log-samples-interval` rollouts and delivered with that rollout's metrics."""
from __future__ import annotations

import json
from pathlib import Path

SAMPLES_DIR = "samples"


def samples_path(run_dir: Path, rollout_id: int) -> Path:
    return run_dir / SAMPLES_DIR / f"rollout_{rollout_id:06d}.jsonl"


def samples_due(interval: int | None, rollout_id: int) -> bool:
    """Whether `--log-samples-interval` logs this rollout's samples (and their per-token file)."""
    return bool(interval) and rollout_id % interval == 0


def sample_row(rollout_id: int, s) -> dict:
    row = dict(rollout_id=rollout_id, index=s.index, group_index=s.group_index, prompt=s.prompt,
               response=s.response, label=s.label, reward=s.reward, raw_reward=s.raw_reward,
               response_length=s.response_length, status=getattr(s.status, "value", str(s.status)),
               advantage=s.metadata.get("advantage"), weight_version=s.weight_version)
    messages = getattr(s, "messages", None) or s.metadata.get("messages")
    if messages:  # a multi-turn trajectory: its turns with roles (and tool calls)
        row["messages"] = messages
    return row


def write_samples(run_dir: Path, rollout_id: int, samples: list) -> Path:
    path = samples_path(run_dir, rollout_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [sample_row(rollout_id, s) for s in samples]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)
    return path


def existing_samples(run_dir: Path, rollout_id: int) -> Path | None:
    path = samples_path(run_dir, rollout_id)
    return path if path.exists() else None
