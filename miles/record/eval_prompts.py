"""Per-prompt eval results: `RUN_DIR/samples/eval/{base,rollout_NNNNNN}.jsonl`, one line per eval prompt.

The journal keeps only an eval set's means (`eval/<set>-pass_at_k`); comparing two runs prompt by
prompt (`miles compare`) needs each prompt's own rewards. A line is `{"eval_set", "eval_step",
"prompt", "label", "rewards", "pass_rate", "responses"}`; the pass rate is the share of samples
with a reward above 0, the rule `pass@k` uses; `responses` are the model's answers, one per reward,
each cut to RESPONSE_CHARS characters (the Evals view shows what the model answered, review N31).
"""
from __future__ import annotations

import json
from pathlib import Path

from miles.record import layout
from miles.record.files import write_jsonl

BASE_NAME = "base"  # the eval of the starting weights (rollout id -1)
# enough for an answer and its reasoning's start; 256 prompts x 4 samples stay ~300 KB per eval
RESPONSE_CHARS = 300


def eval_prompts_path(run_dir: Path, rollout_id: int) -> Path:
    name = BASE_NAME if rollout_id < 0 else f"rollout_{rollout_id:06d}"
    return Path(run_dir) / layout.EVAL_PROMPTS / f"{name}.jsonl"


def prompt_rows(eval_step: int, data: dict) -> list[dict]:
    """One row per prompt of each eval set in Miles' eval `data` (name -> {"samples", ...}), in prompt order."""
    rows = []
    for name, entry in data.items():
        groups: dict[int, list] = {}
        for s in entry.get("samples", []):
            groups.setdefault(s.group_index, []).append(s)
        for _, samples in sorted(groups.items()):
            rewards = [float(s.reward or 0.0) for s in samples]
            rows.append({"eval_set": name, "eval_step": eval_step, "prompt": samples[0].prompt,
                         "label": samples[0].label, "rewards": rewards,
                         "pass_rate": sum(r > 0 for r in rewards) / len(rewards),
                         "responses": [cut(s.response) for s in samples]})
    return rows


def cut(response: str) -> str:
    return response if len(response) <= RESPONSE_CHARS else response[:RESPONSE_CHARS] + "…"


def write_eval_prompts(run_dir: Path, rollout_id: int, eval_step: int, data: dict) -> Path | None:
    """The eval's prompt rows, written whole (None, and no file, when `data` holds no samples)."""
    rows = prompt_rows(eval_step, data)
    if not rows:
        return None
    return write_jsonl(eval_prompts_path(run_dir, rollout_id), rows)


def read_eval_prompts(run_dir: Path) -> dict[int, list[dict]]:
    """Every recorded eval's prompt rows by eval step (the base eval is step 0 unless an eval at rollout 0
    took it; then the later one wins). Lines of the wrong shape are skipped; a torn last line too."""
    folder = Path(run_dir) / layout.EVAL_PROMPTS
    if not folder.is_dir():
        return {}
    files = sorted(p for p in folder.iterdir() if p.suffix == ".jsonl" and p.is_file())
    files.sort(key=lambda p: (p.stem != BASE_NAME, p.stem))  # base first: a later eval at step 0 wins
    out: dict[int, list[dict]] = {}
    for path in files:
        data = path.read_bytes()
        found: dict[int, list[dict]] = {}
        for raw in data[: data.rfind(b"\n") + 1].splitlines():
            row = _row(raw)
            if row is not None:
                found.setdefault(row["eval_step"], []).append(row)
        out.update(found)
    return out


def _row(raw: bytes) -> dict | None:
    try:
        row = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(row, dict):
        return None
    step, rate = row.get("eval_step"), row.get("pass_rate")
    if not isinstance(step, int) or isinstance(step, bool) or not isinstance(row.get("eval_set"), str):
        return None
    if not isinstance(row.get("prompt"), str):
        return None
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0 <= rate <= 1:
        return None  # a pass rate is a share (NaN and a 401-digit integer fail the comparison too)
    answers = row.get("responses")
    if not (isinstance(answers, list) and all(isinstance(a, str) for a in answers)):
        row.pop("responses", None)  # older runs have none; a malformed list is not shown
    else:
        row["responses"] = [cut(a) for a in answers]  # a hand-edited file cannot bloat the view
    return row
