"""Miles' custom rollout and eval loggers, loaded by dotted path and checked at start-up."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from miles.rollout.plugins import load_function

ROLLOUT_FLAG = "--custom-rollout-log-function-path"
EVAL_FLAG = "--custom-eval-rollout-log-function-path"


@dataclass(frozen=True)
class LogHooks:
    rollout: Callable[..., bool] | None  # fn(rollout_id, args, samples, rollout_extra_metrics, rollout_time) -> bool
    eval: Callable[..., bool] | None  # fn(rollout_id, args, data, extra_metrics) -> bool


def load_hooks(tracking: Any) -> LogHooks:
    """Import both hooks and check their signatures; a ConfigError names the bad flag."""
    rollout = tracking.custom_rollout_log_function_path
    evaluation = tracking.custom_eval_rollout_log_function_path
    return LogHooks(rollout=load_function(rollout, ROLLOUT_FLAG, 5) if rollout else None,
                    eval=load_function(evaluation, EVAL_FLAG, 4) if evaluation else None)


def validate_tracking_config(config: Any) -> None:
    """Everything about tracking that can fail before any work starts: the custom loggers
    import and take Miles' arguments. Raises ConfigError naming the flag."""
    load_hooks(config.tracking)
