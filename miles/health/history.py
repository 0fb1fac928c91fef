"""A finished or running run's history and settings, read back for `miles doctor`: from RUN_DIR, or MLflow.

Both give the rollouts the live watch saw (one merged row per rollout) and the flat config
the run was started with, so the same detectors replay it with the same thresholds.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from miles.config import ConfigError
from miles.config.health import HealthConfig
from miles.config.parse import build_section
from miles.health.detectors import Rollout, RunFacts
from miles.health.watch import rollouts_of
from miles.record.journal import JOURNAL_NAME, JournalLine, UnreadableRun, read_journal
from miles.record.journal_check import journal_problems
from miles.record.names import step_key
from miles.record.layout import TRACKING_CONFIG as CONFIG_ARTIFACT


@dataclass(frozen=True)
class RunHistory:
    source: str
    rollouts: list[Rollout]
    params: dict[str, Any]  # the run's flat public config (empty when unknown: defaults apply)
    problems: tuple[str, ...] = ()  # journal lines skipped and values dropped, named (miles.record.journal_check)

    def health_config(self, overrides: dict[str, Any] | None = None) -> HealthConfig:
        known = {k: v for k, v in self.params.items() if k.startswith(("health_", "on_red_flag"))}
        try:
            build_section(HealthConfig, known)
        except ConfigError as exc:
            raise UnreadableRun(f"{self.source}: the run's health settings are not valid: {exc}") from None
        return build_section(HealthConfig, {**known, **(overrides or {})})  # a bad override: the doctor's flag

    def run_facts(self) -> RunFacts:
        p = self.params

        def get(name: str, default: Any, kind: type) -> Any:
            value = p.get(name, default)
            if kind is bool:
                return str(value).strip().lower() in ("1", "true", "yes", "on")
            try:
                return kind(value)
            except (TypeError, ValueError, OverflowError):
                raise UnreadableRun(f"{self.source}: the run's {name} is {value!r:.80}, not a "
                                    f"{kind.__name__}") from None

        return RunFacts(clip_grad=get("clip_grad", 1.0, float),
                        groups_per_rollout=get("rollout_batch_size", 32, int),
                        use_kl_loss=get("use_kl_loss", False, bool))


def from_run_dir(run_dir: Path) -> RunHistory:
    """The run's journal and config; UnreadableRun naming the file when either is not what a run writes
    (a line that is not a journal line is skipped, as every reader of the journal does)."""
    journal = Path(run_dir) / JOURNAL_NAME
    if not journal.exists():
        raise ConfigError("RUN_DIR", f"{run_dir} has no {JOURNAL_NAME} (not a run directory?)")
    try:
        lines = read_journal(journal)  # refuses a FIFO or a directory before opening it
        problems = tuple(journal_problems(journal))
    except (OSError, ValueError) as exc:
        raise UnreadableRun(f"cannot read {journal}: {exc}") from None
    return RunHistory(str(run_dir), rollouts_of(lines), read_run_config(Path(run_dir) / CONFIG_ARTIFACT), problems)


def read_run_config(path: Path) -> dict[str, Any]:
    """The run's flat public config (`tracking/config.yaml`), {} when there is none."""
    if not path.exists():
        return {}
    try:
        if not path.is_file():
            raise UnreadableRun(f"cannot read {path}: not a regular file")
        params = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise UnreadableRun(f"cannot read {path}: not UTF-8 text") from None
    except (OSError, yaml.YAMLError) as exc:
        raise UnreadableRun(f"cannot read {path}: {' '.join(str(exc).split())[:300]}") from None
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise UnreadableRun(f"cannot read {path}: a YAML {type(params).__name__}, not a mapping of settings")
    odd = [k for k in params if not isinstance(k, str)]  # `1: 2` or `~: x`: no setting has such a name
    if odd:
        odd = odd[0]
        raise UnreadableRun(f"cannot read {path}: the setting name {odd!r:.80} is a YAML "
                            f"{type(odd).__name__}, not a string")
    return params


def from_mlflow(run_id: str, tracking_uri: str) -> RunHistory:
    """Rebuild the journal lines from MLflow: every point of one journal line carries that line's
    timestamp, and the step of its points on the rollout/step axis (rollout/*, perf/*, ...) is the rollout
    id (the step axes themselves are not MLflow metrics)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        raise ConfigError("RUN_DIR", f"{run_id!r} is neither a run directory nor an MLflow run at "
                                     f"{tracking_uri}: {exc.message}") from None
    by_time: dict[int, dict[str, float]] = {}
    rollout_at: dict[int, int] = {}  # timestamp -> the step of a point on the rollout/step axis: the rollout id
    for key in run.data.metrics:
        if key.startswith("system/"):  # MLflow's own samples, not journal lines
            continue
        for point in client.get_metric_history(run_id, key):
            by_time.setdefault(point.timestamp, {})[key] = point.value
            if step_key(key) == "rollout/step":
                rollout_at[point.timestamp] = point.step
    lines = []
    for timestamp, metrics in sorted(by_time.items()):
        # a line of eval metrics alone is the eval before training (a later eval joins its rollout's line)
        rollout_id = rollout_at.get(timestamp, -1 if any(k.startswith("eval/") for k in metrics) else None)
        if rollout_id is not None:
            lines.append(JournalLine(int(rollout_id), timestamp / 1000.0, metrics))
    return RunHistory(f"mlflow run {run_id}", rollouts_of(lines), dict(run.data.params))
