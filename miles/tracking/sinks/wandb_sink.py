"""wandb as a sink: offline unless WANDB_API_KEY is set, `define_metric` step axes per namespace.

wandb's own metadata capture (argv, environment, git, code) is off. Each row is logged at
wandb step = its journal line's index, so a line delivered again (a crash between a log call
and the cursor save) is below the run's current step, which wandb ignores instead of doubling
the point; online too, where a resumed run continues after the last step the server holds.
Offline, a new process writes a new offline dir, so the cursor is corrected from the offline
files instead (`durable_cursor`).
"""
from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from typing import Any

from miles.health.alerts import AlertLimiter, alert_text, alert_title, red_flags_in
from miles.health.signals import SIGNALS
from miles.record.names import STEP_KEYS
from miles.tracking.sinks.base import Delivery, SinkSpec

# the .wandb file is flushed this often; a crash loses at most this much, which
# `durable_cursor` then finds missing and redelivers
FLUSH_INTERVAL_S = 1.0
AXES = {"train/*": "train/step", "rollout/*": "rollout/step", "perf/*": "rollout/step",
        "multi_turn/*": "rollout/step", "passrate/*": "rollout/step", "eval/*": "eval/step",
        "health/*": "rollout/step", "straggler/*": "rollout/step", "moe/*": "rollout/step"}
SAMPLES_KEY = "rollout/samples"


def new_run_id() -> str:
    return secrets.token_hex(4)  # wandb run ids are short [a-z0-9] strings


def resolve_mode(mode: str | None, api_key: str | None) -> str:
    if mode:
        return mode
    return "online" if api_key or os.environ.get("WANDB_API_KEY") else "offline"


class WandbSink:
    name = "wandb"

    def __init__(self, params: dict[str, Any], run_id: str, directory: str, mode: str, project: str,
                 group: str | None = None, entity: str | None = None, run_name: str | None = None):
        self.params, self.run_id, self.directory, self.mode = params, run_id, directory, mode
        self.project, self.group, self.entity, self.run_name = project, group, entity, run_name
        self.run = None
        self.alerts = AlertLimiter(float(params.get("health_alert_interval", 300.0)))

    def spec(self) -> SinkSpec:
        return SinkSpec("wandb", dict(run_id=self.run_id, directory=self.directory, mode=self.mode,
                                      project=self.project, group=self.group, entity=self.entity,
                                      run_name=self.run_name))

    def prepare(self) -> None:
        import wandb  # noqa: F401  (seconds of imports, before the trainer needs its run)

    def open(self) -> None:
        import wandb

        Path(self.directory).mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(console="off", silent=True, x_disable_meta=True, disable_git=True,
                                  save_code=False, x_disable_stats=True,
                                  x_transaction_log_flush_interval=FLUSH_INTERVAL_S)
        self.run = wandb.init(project=self.project, entity=self.entity, group=self.group, name=self.run_name,
                              id=self.run_id, resume="allow", mode=self.mode, dir=self.directory,
                              config=self.params, settings=settings, reinit="create_new")
        for key in STEP_KEYS:
            self.run.define_metric(key)
        for pattern, axis in AXES.items():
            self.run.define_metric(pattern, step_metric=axis)

    def durable_cursor(self, recorded: int) -> int:
        if self.mode != "offline":
            return recorded
        from miles.tracking.wandb_files import offline_history_rows  # imports wandb's protobufs

        # offline files are the store: one history row per journal line, in journal order
        return offline_history_rows(Path(self.directory), self.run_id)

    def deliver(self, delivery: Delivery) -> None:
        for i, line in enumerate(delivery.lines):
            row: dict[str, Any] = dict(line.metrics)
            if i in delivery.samples:
                row[SAMPLES_KEY] = self._table(delivery.samples[i])
            self.run.log(row, step=delivery.first + i, commit=True)
            self._alert(line)

    def _alert(self, line) -> None:
        """A wandb alert per red flag of the health watch in this line, rate-limited per signal."""
        for signal in red_flags_in(line.metrics):
            if self.alerts.allow(signal):
                self.run.alert(title=alert_title(signal, line.rollout_id),
                               text=alert_text(signal, line.rollout_id, line.metrics), level="ERROR",
                               wait_duration=self.alerts.interval or None)

    def alert_live(self, verdict) -> None:
        """A red flag raised while its rollout still runs (a hung phase): no journal line carries it yet."""
        if self.alerts.allow(verdict.signal):
            self.run.alert(title=alert_title(verdict.signal, verdict.rollout_id),
                           text=f"{verdict.message} (still running). {SIGNALS[verdict.signal].advice}",
                           level="ERROR", wait_duration=self.alerts.interval or None)

    def _table(self, path: Path):
        import wandb

        from miles.record.sample_table import sample_table

        columns, rows = sample_table(path)  # bounded: rows, text and log-probs per row
        return wandb.Table(columns=columns, data=rows)

    def upload(self, files: list[Path]) -> None:
        # copied into the run's files dir, which wandb syncs at finish (run.save would symlink
        # and warn, and a symlink to a file still being written is not an artifact)
        for path in files:
            target = Path(self.run.dir) / path.name
            if path.is_dir():
                shutil.copytree(path, target, dirs_exist_ok=True)
            elif path.is_file():
                shutil.copy2(path, target)

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None

