"""The run's evals around the iteration: when one is due (--eval-interval, and after the last
rollout), what an eval generates (its pause explained), and the base eval each is compared to."""
from __future__ import annotations

import json
from pathlib import Path

from miles.record import layout


def eval_due(rollout_config, eval_sets: list, rollout_id: int) -> bool:
    interval = rollout_config.eval_interval
    if interval is None or not eval_sets:
        return False
    return (rollout_id + 1) % interval == 0 or rollout_id == rollout_config.num_rollout - 1


def eval_what(eval_sets: list, samples_per_prompt: int) -> str:
    """`arithmetic (64 prompts x 4 samples)`: what an eval generates."""
    return ", ".join(f"{s.name} ({len(s.prompts)} prompts x {samples_per_prompt} samples)"
                     for s in eval_sets)


def saved_base_eval(run_dir: Path) -> dict[str, float]:
    """The starting weights' eval metrics (RUN_DIR/base_eval.json), {} when there is none."""
    try:
        return json.loads((Path(run_dir) / layout.BASE_EVAL).read_text())
    except (OSError, ValueError):
        return {}
