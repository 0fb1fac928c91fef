"""What a run is, in the words trackers and the Prefect UI show: its name, tags and a one-line description."""
from __future__ import annotations

import os
import subprocess
from functools import cache
from pathlib import Path

import miles

FLOW_RUN_URL_ENV = "MILES_PREFECT_FLOW_RUN_URL"  # set by the Prefect flow for its Ray workers
DEFAULT_TASK = "arithmetic"  # the tiny task that runs when --prompt-data is not given


def run_name(run_dir: str | Path) -> str:
    """A run is named after its run directory, the one thing a user picked (or was shown)."""
    return Path(run_dir).name


def is_tiny_default(path: str | None) -> bool:
    """No path, or one `resolve` filled in from the tiny defaults (they live in the miles cache)."""
    from miles.config.cache import cache_root

    return not path or Path(path).resolve().is_relative_to(cache_root().resolve())


def model_name(config) -> str:
    """The checkpoint's directory name, or the built-in tiny model's label (given or resolved, the same)."""
    checkpoint = config.rollout.hf_checkpoint
    return "tiny-qwen3 (built in)" if is_tiny_default(checkpoint) else Path(checkpoint).name


def task_name(config) -> str:
    data = config.rollout.prompt_data
    return DEFAULT_TASK if is_tiny_default(data) else Path(data).stem


@cache
def git_commit() -> str | None:
    """The commit of the checkout this code runs from (None for an installed copy without git)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(miles.__file__).parent, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def describe(config, run_dir: str | Path) -> str:
    """`GRPO (fsdp) of tiny-qwen3 on arithmetic: 20 rollouts x 32 prompts x 8 samples, run dir /x/runs/a`."""
    r = config.rollout
    return (f"GRPO ({config.train.train_backend}) of {model_name(config)} on {task_name(config)}: "
            f"{r.num_rollout} rollouts x {r.rollout_batch_size} prompts x {r.n_samples_per_prompt} samples, "
            f"run dir {Path(run_dir).resolve()}")


def run_tags(config, run_dir: str | Path) -> dict[str, str]:
    """Tags a tracker run carries: backend, model, task, miles version, git commit, the Prefect flow run, and
    MLflow's source (the entry point: `miles train` when the flow's workers record, else the plain driver)."""
    tags = {"miles.train_backend": config.train.train_backend, "miles.model": model_name(config),
            "miles.task": task_name(config), "miles.version": miles.__version__,
            "miles.run_dir": str(Path(run_dir).resolve())}
    if commit := git_commit():
        tags["mlflow.source.git.commit"] = commit  # MLflow's own key: the UI shows it as the run's source version
    url = os.environ.get(FLOW_RUN_URL_ENV)
    if url:
        tags["prefect.flow_run_url"] = url
    # the run page's "Source" (blank without these): which entry point trained, beside the commit above
    tags["mlflow.source.type"] = "LOCAL"
    tags["mlflow.source.name"] = "miles train (Prefect flow grpo)" if url else "python -m miles.train"
    return tags
