"""Settings of the trackers: stdout row, journal, wandb, MLflow, TensorBoard, custom loggers."""
from __future__ import annotations

from dataclasses import dataclass

from miles.config.fields import flag


@dataclass(frozen=True)
class TrackingConfig:
    """Where metrics go."""

    use_wandb: bool = flag(False, "log to Weights & Biases")
    wandb_project: str = flag("miles", "wandb project")
    wandb_group: str | None = flag(None, "wandb group")
    wandb_team: str | None = flag(None, "wandb entity (team)")
    wandb_mode: str | None = flag(None, "wandb mode (default: online with WANDB_API_KEY set, else offline)",
                                  choices=("online", "offline", "disabled"))
    wandb_dir: str | None = flag(None, "wandb local directory (default: RUN_DIR)")
    wandb_run_id: str | None = flag(None, "wandb run id to continue")
    wandb_key: str | None = flag(None, "wandb API key (prefer env WANDB_API_KEY); never stored", secret=True)
    use_mlflow: bool = flag(False, "log to MLflow")
    mlflow_tracking_uri: str | None = flag(None, "MLflow tracking URI (default: sqlite:///RUN_DIR/../mlflow.db, one store for the runs beside this one)")
    mlflow_experiment_name: str = flag("miles", "MLflow experiment")
    mlflow_run_name: str | None = flag(None, "MLflow run name (default: the run dir's name)")
    mlflow_run_id: str | None = flag(None, "MLflow run id to continue")
    mlflow_system_metrics: bool = flag(True, "log MLflow's system metrics (system/*: CPU, memory, disk, network, GPU) "
                                             "while the run is open; --no-mlflow-system-metrics turns them off")
    mlflow_ui: bool = flag(False, "start `mlflow ui` on 127.0.0.1 for the run's MLflow store and leave it up")
    use_tensorboard: bool = flag(False, "write TensorBoard scalars")
    tensorboard_dir: str | None = flag(None, "TensorBoard scalars (default: RUN_DIR/tensorboard) and "
                                                 "profiler traces (default: RUN_DIR/profiler)")
    log_samples_interval: int | None = flag(10, "log a table of sample generations every N rollouts and at the "
                                                "last one", minimum=1)
    custom_rollout_log_function_path: str | None = flag(
        None, "dotted path of fn(rollout_id, args, samples, rollout_extra_metrics, rollout_time) -> bool")
    custom_eval_rollout_log_function_path: str | None = flag(
        None, "dotted path of fn(rollout_id, args, data, extra_metrics) -> bool")
    baseline_run_dirs: list[str] = flag([], "run dirs to compare the run with at its end (`miles compare`'s "
                                            "verdicts: printed, MLflow tags miles.compare*, the flow's grpo-compare "
                                            "artifact); the run never fails on it")
    tracking_retry_interval: float = flag(2.0, "seconds between retries of a failed tracker (its points stay spooled)",
                                          minimum=0.05)
    tracking_close_timeout: float = flag(30.0, "seconds the end of a run waits for a failed tracker to come back "
                                               "before leaving its points to `miles replay-spool`", minimum=0.0)
