"""Sample-generation tables: `RUN_DIR/samples/rollout_<id>.jsonl`, one row per sample,
written every `--log-samples-interval` rollouts and delivered with that rollout's metrics.

A multi-turn sample's row also holds its conversation turn by turn (`turns`: {role, text,
tool_call?}) and the same as chat `messages` (assistant tool calls as `tool_calls`), which the
dashboard shows; its per-token loss mask is in the token file (`miles/record/tokens.py`)."""
from __future__ import annotations

from pathlib import Path

from miles.record import layout
from miles.record.files import write_jsonl
from miles.record.unicode_text import valid_text

SAMPLES_DIR = layout.SAMPLES


def samples_path(run_dir: Path, rollout_id: int) -> Path:
    return run_dir / SAMPLES_DIR / f"rollout_{rollout_id:06d}.jsonl"


def samples_due(interval: int | None, rollout_id: int, num_rollout: int | None = None) -> bool:
    """Whether `--log-samples-interval` logs this rollout's samples (and their per-token file): every
    interval-th rollout, and the run's last one, so that the final policy has a sample table (first-hour
    N12: rollouts 0, 10, ..., 90 of 100 left rollout 99 without one)."""
    last = num_rollout is not None and rollout_id == num_rollout - 1
    return bool(interval) and (rollout_id % interval == 0 or last)


def sample_row(rollout_id: int, s) -> dict:
    row = dict(rollout_id=rollout_id, index=s.index, group_index=s.group_index, prompt=s.prompt,
               response=s.response, label=s.label, reward=s.reward, raw_reward=s.raw_reward,
               response_length=s.response_length, status=getattr(s.status, "value", str(s.status)),
               advantage=s.metadata.get("advantage"), weight_version=s.weight_version,
               num_turns=getattr(s, "num_turns", 1),
               # the engine's log-prob of each response token (at most --rollout-max-response-len of them)
               rollout_log_probs=[round(float(lp), 6) for lp in getattr(s, "rollout_log_probs", None) or []])
    turns = getattr(s, "turns", None)
    if turns:  # a multi-turn trajectory: its turns with roles (and tool calls)
        row["turns"] = turns
    messages = (chat_messages(turns) if turns else None) or s.metadata.get("messages")
    if messages:
        row["messages"] = messages
    return row


def chat_messages(turns: list[dict]) -> list[dict]:
    """Turns as chat messages: {role, content}, each tool call on the assistant message that made it."""
    messages: list[dict] = []
    for turn in turns:
        call = turn.get("tool_call")
        if turn["role"] == "tool" and call and messages and messages[-1]["role"] == "assistant":
            messages[-1].setdefault("tool_calls", []).append({"type": "function", "function": call})
        messages.append({"role": turn["role"], "content": turn["text"]})
    return messages


def write_samples(run_dir: Path, rollout_id: int, samples: list) -> Path:
    """The rollout's rows, their text made valid UTF-8: a hook's response or a tool's output may hold a lone
    surrogate, which every reader of the file (trackers' tables, the dashboard) would have to refuse."""
    rows = [valid_text(sample_row(rollout_id, s)) for s in samples]
    return write_jsonl(samples_path(run_dir, rollout_id), rows)
