"""`resolve(config, task)`: every run-wide default filled in once, as absolute paths. Pure: it makes no file.

After it, every part of a run reads fields instead of working defaults out again: the run
dir, the model and data paths, checkpoint dirs, the MLflow URI, the TensorBoard and wandb
dirs. Where the flags name no model or data, the run falls back on `task` (the tiny task's
cached files; `miles.prepare` names them and makes them when missing). The router admin
token is not copied in: it stays in the environment (`miles.config.secrets.resolve_admin_token`),
so it never travels in a config that Prefect stores as a parameter.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from miles.config.rollout import DEFAULT_EVAL_NAME
from miles.record import layout
from miles.config.mlflow_store import default_store_uri


@dataclass(frozen=True)
class TaskDefaults:
    """What a run falls back on when its flags name no model or prompt data."""

    model: Path
    train_data: Path
    eval_data: Path
    eval_name: str = DEFAULT_EVAL_NAME


def default_run_dir() -> Path:
    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")


def _absolute(value: str | None) -> str | None:
    return str(Path(value).expanduser().resolve()) if value else value


def resolve(config, task: TaskDefaults | None = None):
    """A copy of `config` with every default the run needs filled in (idempotent). Without `task`, a
    config that names no model or prompt data keeps them empty (`is_resolved` says so)."""
    r, t, tr = config.rollout, config.train, config.tracking
    run_dir = Path(_absolute(t.run_dir) or default_run_dir().resolve())
    prompt_data, eval_pairs = _absolute(r.prompt_data), list(r.eval_prompt_data)
    if prompt_data is None and task is not None:  # the fallback task: its train set and, unless given, its eval set
        prompt_data = str(task.train_data)
        eval_pairs = eval_pairs or [task.eval_name, str(task.eval_data)]
    model = _absolute(r.hf_checkpoint) or (str(task.model) if task is not None else None)
    save = _absolute(t.save) or str(run_dir / layout.CHECKPOINTS)
    # Miles' --rollout-num-gpus-per-engine is the tensor-parallel size of each SGLang engine
    tp_size = max(config.engine.sglang_tp_size, r.rollout_num_gpus_per_engine)
    return config.replace(
        sglang_tp_size=tp_size,
        run_dir=str(run_dir),
        hf_checkpoint=model,
        prompt_data=prompt_data,
        eval_prompt_data=[v if i % 2 == 0 else _absolute(v) for i, v in enumerate(eval_pairs)],
        save=save, load=_absolute(t.load) or save,
        mlflow_tracking_uri=tr.mlflow_tracking_uri or default_store_uri(run_dir),
        tensorboard_dir=_absolute(tr.tensorboard_dir) or str(run_dir / layout.TENSORBOARD),
        wandb_dir=_absolute(tr.wandb_dir) or str(run_dir),
    )


def is_resolved(config) -> bool:
    """Whether `config` went through `resolve` with a model and data (what a run's parts may rely on)."""
    t, r, tr = config.train, config.rollout, config.tracking
    return all(v and Path(v).is_absolute() for v in (t.run_dir, t.save, t.load, r.hf_checkpoint, r.prompt_data,
                                                       tr.tensorboard_dir, tr.wandb_dir)) \
        and bool(tr.mlflow_tracking_uri)


def require_resolved(config, who: str) -> None:
    """Fail loudly when a part that relies on resolved paths is handed raw flags."""
    if not is_resolved(config):
        raise ValueError(f"{who} takes a prepared config: build it with miles.prepare.prepare(argv) "
                         f"(or prepare_config(parse_config(argv)))")
