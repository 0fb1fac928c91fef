"""Sample-generation tables: `RUN_DIR/samples/rollout_<id>.jsonl`, one row per sample,
written every `--log-samples-interval` rollouts and delivered with that rollout's metrics.

Besides prompt, response and reward, a row holds the conversation turn by turn
(`turns`: {role, text, tool_call?}) and the per-token `loss_mask` of the response (0 on
tool observations), for views that show what was trained."""
from __future__ import annotations

import json
from pathlib import Path

SAMPLES_DIR = "samples"


def samples_path(run_dir: Path, rollout_id: int) -> Path:
    return run_dir / SAMPLES_DIR / f"rollout_{rollout_id:06d}.jsonl"


def conversation(sample) -> list[dict]:
    """The sample turn by turn with roles: a multi-turn sample's own turns, else prompt and response."""
    if sample.turns:
        return sample.turns
    return [{"role": "user", "text": sample.prompt}, {"role": "assistant", "text": sample.response}]


def write_samples(run_dir: Path, rollout_id: int, samples: list) -> Path:
    path = samples_path(run_dir, rollout_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [dict(rollout_id=rollout_id, prompt=s.prompt, response=s.response, label=s.label, reward=s.reward,
                 raw_reward=s.raw_reward, response_length=s.response_length,
                 status=getattr(s.status, "value", str(s.status)), num_turns=s.num_turns, turns=conversation(s),
                 loss_mask=s.loss_mask if s.loss_mask is not None else [1] * s.response_length)
            for s in samples]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)
    return path


def existing_samples(run_dir: Path, rollout_id: int) -> Path | None:
    path = samples_path(run_dir, rollout_id)
    return path if path.exists() else None
