"""The tiny tasks' warm-start recipes and the cache paths named after them, with no torch: every run's
driver names these paths as it starts, and importing the model makers with them cost it ~5 CPU-s of
torch and transformers (py-spy, a 4-rollout plain run), in every run and in every test that starts one."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from miles.config.cache import cache_root
from miles.tiny import tool_task
from miles.tiny.task import write_task_data

# The addition task's SFT (miles.tiny.warmstart); a change makes a new cached model, named by its hash.
ADDITION = dict(version=3, seed=0, lr=3e-3, batch_size=64, max_steps=8000, eval_every=250,
                label_smoothing=0.3, target_greedy=0.95, eval_prompts=256)
# The tiny mixture-of-experts policy's SFT (miles.tiny.moe_model): the addition recipe with the
# router's load-balancing loss in the objective (at the model's router_aux_loss_coef), as its RL
# training keeps it, so every expert learns a share of the tokens from the start.
ADDITION_MOE = dict(ADDITION, policy="moe", router_aux_loss=True)
# The calculator task's SFT (miles.tiny.tool_warmstart).
TOOL = dict(version=2, seed=0, lr=3e-3, batch_size=64, max_steps=1500, eval_every=100, tool_rows=0.5,
            call_share=0.3, target_tool_path=0.95, eval_prompts=256)


def recipe_id(recipe: dict) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:10]


def base_model_dir() -> Path:
    return cache_root() / f"tiny-base-{recipe_id(ADDITION)}"


def moe_base_model_dir() -> Path:
    return cache_root() / f"tiny-moe-base-{recipe_id(ADDITION_MOE)}"


def task_data_dir() -> Path:
    return cache_root() / "tiny-task"


def default_task_data() -> tuple[Path, Path]:
    """The arithmetic train and eval JSONL files (written on first use)."""
    return write_task_data(task_data_dir(), seed=ADDITION["seed"])


def tool_model_dir() -> Path:
    return cache_root() / f"tiny-tool-base-{recipe_id(TOOL)}"


def tool_task_dir() -> Path:
    return cache_root() / "tiny-tool-task"


def tool_task_data() -> tuple[Path, Path]:
    """The multiplication train and eval JSONL files (written on first use)."""
    return tool_task.write_task_data(tool_task_dir(), seed=TOOL["seed"])
