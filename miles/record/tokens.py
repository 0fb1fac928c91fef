"""Per-token data of the logged samples: `RUN_DIR/tokens/rollout_<id>.jsonl`, one line per sample.

Written only on `--log-samples-interval` rollouts, next to the sample table: each response
token's id and text, the engine's (rollout) log-prob, the training ranks' log-prob and
entropy of the same position, and the loss mask (0 for observation tokens a multi-turn
environment inserted). Floats are rounded to 4 decimals to keep the file small.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from miles.record import layout
from miles.record.files import write_jsonl

TOKENS_DIR = layout.TOKENS
DIGITS = 4


def tokens_path(run_dir: Path, rollout_id: int) -> Path:
    return Path(run_dir) / TOKENS_DIR / f"rollout_{rollout_id:06d}.jsonl"


def _rounded(values) -> list[float]:
    return [round(float(v), DIGITS) for v in values or []]


def token_row(sample: Any, token_texts: list[str], train: dict[str, list[float]] | None) -> dict[str, Any]:
    """One sample's line. `train` holds the ranks' `log_probs` and `entropy` per response token."""
    ids = list(sample.response_ids)
    mask = getattr(sample, "loss_mask", None) or sample.metadata.get("loss_mask") or [1] * len(ids)
    return {"index": sample.index, "group_index": sample.group_index, "ids": ids, "text": token_texts,
            "rollout_log_probs": _rounded(sample.rollout_log_probs),
            "log_probs": _rounded((train or {}).get("log_probs")),
            "entropy": _rounded((train or {}).get("entropy")), "loss_mask": [int(m) for m in mask]}


def write_tokens(run_dir: Path, rollout_id: int, samples: list, tokenizer: Any,
                 train_stats: dict[int, dict[str, list[float]]]) -> Path:
    """Write the rollout's token file (atomically)."""
    vocab_text = _token_texts(tokenizer)
    rows = [token_row(s, [vocab_text(i) for i in s.response_ids], train_stats.get(s.index)) for s in samples]
    return write_jsonl(tokens_path(run_dir, rollout_id), rows, separators=(",", ":"))


def _token_texts(tokenizer: Any):
    """id -> the text it decodes to on its own (cached per tokenizer: the vocab is decoded once)."""
    cache = getattr(tokenizer, "_miles_token_texts", None)
    if cache is None:
        cache = {}
        try:
            setattr(tokenizer, "_miles_token_texts", cache)
        except AttributeError:
            pass

    def text(token_id: int) -> str:
        if token_id not in cache:
            cache[token_id] = tokenizer.decode([token_id])
        return cache[token_id]
    return text
