"""`resolve(config)`: every run-wide default filled in once, as absolute paths, before anything starts.

After it, every part of a run reads fields instead of working defaults out again: the run
dir, the model and data paths, checkpoint dirs, the MLflow URI, the TensorBoard and wandb
dirs. The Ray actor names follow from the run dir (`run_names`). The router admin token is
not copied in: it stays in the environment (`miles.router.app.resolve_admin_token`), so it
never travels in a config that Prefect stores as a parameter.
"""
from __future__ import annotations

import time
from pathlib import Path

from miles.cluster.names import RunNames


def default_run_dir() -> Path:
    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")


def _absolute(value: str | None) -> str | None:
    return str(Path(value).expanduser().resolve()) if value else value


def resolve(config):
    """A copy of `config` with every default the run needs filled in (idempotent)."""
    from miles.rollout.evaluation import DEFAULT_EVAL_NAME
    from miles.tiny.defaults import tiny_model, tiny_task_data

    r, t, tr = config.rollout, config.train, config.tracking
    multi_turn = config.generate.custom_generate_function_path is not None  # the tiny calculator task's defaults
    run_dir = Path(_absolute(t.run_dir) or default_run_dir().resolve())
    prompt_data, eval_pairs = _absolute(r.prompt_data), list(r.eval_prompt_data)
    if prompt_data is None:  # the tiny task: its train set and, unless given, its eval set
        train_path, eval_path = tiny_task_data(multi_turn)
        prompt_data = str(train_path)
        eval_pairs = eval_pairs or [DEFAULT_EVAL_NAME, str(eval_path)]
    save = _absolute(t.save) or str(run_dir / "checkpoints")
    # Miles' --rollout-num-gpus-per-engine is the tensor-parallel size of each SGLang engine
    tp_size = max(config.engine.sglang_tp_size, r.rollout_num_gpus_per_engine)
    return config.replace(
        sglang_tp_size=tp_size,
        run_dir=str(run_dir),
        hf_checkpoint=_absolute(r.hf_checkpoint) or str(tiny_model(multi_turn)),
        prompt_data=prompt_data,
        eval_prompt_data=[v if i % 2 == 0 else _absolute(v) for i, v in enumerate(eval_pairs)],
        save=save, load=_absolute(t.load) or save,
        mlflow_tracking_uri=tr.mlflow_tracking_uri or f"sqlite:///{run_dir / 'mlflow.db'}",
        tensorboard_dir=_absolute(tr.tensorboard_dir) or str(run_dir / "tensorboard"),
        wandb_dir=_absolute(tr.wandb_dir) or str(run_dir),
    )


def run_names(config) -> RunNames:
    """The names of a resolved run's Ray actors."""
    return RunNames.for_run_dir(config.train.run_dir)
