"""The run tracker behind `open_tracking`: stdout row and journal on the training thread;
every tracker fed from the journal, line by line as it is recorded, by a separate delivery
process (`miles replay-spool RUN_DIR --follow`), started with the tracker; `open` (after the
checkpoint is read) lets it open the tracker runs."""
from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from miles.run_info import describe, run_name, run_tags
from miles.tracking.delivery_process import DeliveryProcess
from miles.tracking.hooks import load_hooks
from miles.tracking.journal import BASE_EVAL_ROLLOUT_ID, Journal, JournalLine
from miles.tracking.names import map_metrics
from miles.tracking.report import REPORT_NAME, write_report
from miles.tracking.row import format_eval, format_row
from miles.tracking.samples import samples_due, write_samples
from miles.tracking.secrets import public_params, scrubber_for
from miles.tracking.sinks.base import SinkSpec
from miles.tracking.sinks.mlflow_sink import default_tracking_uri
from miles.tracking.sinks.wandb_sink import new_run_id, resolve_mode
from miles.tracking.state import CONFIG_ARTIFACT, DeliveryState, TrainerFile

log = logging.getLogger("miles.tracking")
PROFILER_DIRS = ("profiler", "profiles", "traces")  # under RUN_DIR, uploaded when present
__all__ = ["CONFIG_ARTIFACT", "RunTracker", "build_run_tracker", "build_specs"]


@dataclass(frozen=True)
class FinishReport:
    undelivered: dict[str, int] = field(default_factory=dict)  # tracker -> journal lines still spooled


def spooled(run_dir: Path, names: list[str], recorded: int) -> FinishReport:
    """What is still undelivered per tracker by the delivery state on disk, each one logged with
    how to deliver it."""
    sinks = DeliveryState.load(run_dir).sinks
    undelivered = {name: recorded - (sinks[name].cursor if name in sinks else 0) for name in names}
    report = FinishReport({name: n for name, n in undelivered.items() if n > 0})
    for name, count in report.undelivered.items():
        log.warning("tracking: %d journal lines for %s are still spooled; deliver them with "
                    "`miles replay-spool %s`", count, name, run_dir)
    return report


def build_specs(config: Any, run_dir: Path, previous: DeliveryState, extra: dict) -> dict[str, SinkSpec]:
    """The spec of every tracker that is on. A run id comes from its flag, else the checkpoint's
    `extra`, else the run dir's delivery state (same run dir, same runs)."""
    t = config.tracking

    def known(name: str) -> str | None:
        before = previous.sinks.get(name)
        return extra.get(f"{name}_run_id") or (before.spec.options.get("run_id") if before else None)

    specs: dict[str, SinkSpec] = {}
    if t.use_wandb:
        specs["wandb"] = SinkSpec("wandb", dict(
            run_id=t.wandb_run_id or known("wandb") or new_run_id(), directory=str(t.wandb_dir or run_dir),
            mode=resolve_mode(t.wandb_mode, t.wandb_key), project=t.wandb_project, group=t.wandb_group,
            entity=t.wandb_team, run_name=None))
    if t.use_mlflow:
        uri = t.mlflow_tracking_uri or default_tracking_uri(run_dir)
        local = uri.startswith(("sqlite:", "file:")) or "://" not in uri
        specs["mlflow"] = SinkSpec("mlflow", dict(
            tracking_uri=uri, experiment=t.mlflow_experiment_name, run_id=t.mlflow_run_id or known("mlflow"),
            run_name=t.mlflow_run_name or run_name(run_dir), artifact_dir=str(run_dir / "mlartifacts") if local else None,
            tags=run_tags(config, run_dir), description=describe(config, run_dir),
            system_metrics=t.mlflow_system_metrics))
    if t.use_tensorboard:
        specs["tensorboard"] = SinkSpec("tensorboard", dict(log_dir=str(t.tensorboard_dir or run_dir / "tensorboard")))
    return specs


class RunTracker:
    """Implements `miles.tracking.protocol.RunTracker`."""

    def __init__(self, config: Any, run_dir: Path):
        self.hooks = load_hooks(config.tracking)  # a bad hook fails before anything is written
        self.config, self.run_dir = config, Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.scrubber = scrubber_for(config)
        self.params = public_params(config, self.scrubber)
        self.journal = Journal(self.run_dir)
        self.trainer_file = TrainerFile.load(self.run_dir)
        self.pending: dict[int, dict[str, float]] = {}  # default rollout/eval metrics awaiting their record
        self.opened = self.closed = False
        path = self.run_dir / CONFIG_ARTIFACT
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.params, sort_keys=True))
        # The delivery process starts now, so it imports the trackers (and creates a local MLflow
        # store) while the trainer starts; it opens their runs once `open` passed the checkpoint's ids.
        self.session = secrets.token_hex(8)
        self.specs = build_specs(config, self.run_dir, DeliveryState.load(self.run_dir), {})
        self.trainer_file.trackers = dict(self.specs)
        self.trainer_file.claim(self.session)
        self.trainer_file.save()
        self.delivery: DeliveryProcess | None = None  # None with every tracker off, or when it could not start
        if self.specs:
            t = config.tracking
            try:
                self.delivery = DeliveryProcess(self.run_dir, self.session, t.tracking_retry_interval,
                                                self.scrubber.secrets, t.wandb_key)
            except OSError as exc:  # training goes on without it
                log.warning("tracking: cannot start the delivery process (%s); training goes on, the journal's "
                            "points stay spooled for `miles replay-spool %s`", self.scrubber.scrub(str(exc)),
                            self.run_dir)

    def _require_open(self) -> None:
        if not self.opened:
            raise RuntimeError("the tracker is not open: call open(extra) once the checkpoint is read "
                               "(open({}) for a fresh run)")

    # -- the contract -----------------------------------------------------------
    def open(self, extra: dict[str, Any]) -> None:
        if self.opened or self.closed:
            raise RuntimeError("open() opens the tracker once per process; it is already open or closed")
        self.specs = build_specs(self.config, self.run_dir, DeliveryState.load(self.run_dir), extra or {})
        self.trainer_file.trackers = dict(self.specs)
        self.trainer_file.trainer["open"] = self.opened = True
        self.trainer_file.save()

    @property
    def delivery_pid(self) -> int | None:
        """The delivery process's pid (None with every tracker off)."""
        return self.delivery.pid if self.delivery is not None else None

    def wait_open(self, timeout: float) -> None:
        """Block until every tracker run is open (benchmarks and tests that time or kill delivery);
        TimeoutError after `timeout`, RuntimeError if the delivery process is gone."""
        self._require_open()
        deadline = time.monotonic() + timeout
        while self.delivery is not None:
            sinks = DeliveryState.load(self.run_dir).sinks
            if all(name in sinks and sinks[name].session == self.session for name in self.specs):
                return
            if not self.delivery.check():
                raise RuntimeError("the tracking delivery process exited before every tracker run was open")
            if time.monotonic() > deadline:
                raise TimeoutError(f"trackers not open after {timeout}s")
            time.sleep(0.05)  # poll interval, bounded by the deadline

    def checkpoint_extra(self) -> dict[str, Any]:
        self._require_open()
        known = DeliveryState.load(self.run_dir).sinks  # the delivery process fills in run ids as it opens
        ids = {name: spec.options.get("run_id") or (known[name].spec.options.get("run_id") if name in known else None)
               for name, spec in self.specs.items()}
        return {f"{name}_run_id": run_id for name, run_id in ids.items() if run_id}

    def log_rollout(self, rollout_id: int, args: Any, samples: list, extra_metrics: dict,
                    rollout_time: float) -> None:
        self._require_open()
        if samples_due(self.config.tracking.log_samples_interval, rollout_id) and not self.recorded(rollout_id):
            write_samples(self.run_dir, rollout_id, samples)
        if self.hooks.rollout is not None and self.hooks.rollout(rollout_id, args, samples, extra_metrics,
                                                                 rollout_time):
            return  # Miles: True means the custom logger replaced the default one
        # The default logging records the rollout metrics the loop computed from these samples
        # (miles.rollout.metrics is their one source); samples also feed the table and the hooks.
        self.pending.setdefault(rollout_id, {}).update(map_metrics(extra_metrics))

    def log_eval(self, rollout_id: int, args: Any, data: dict, extra_metrics: dict) -> None:
        self._require_open()
        if self.hooks.eval is not None and self.hooks.eval(rollout_id, args, data, extra_metrics):
            return
        # recorded with the iteration's line (the loop evaluates before it records)
        self.pending.setdefault(rollout_id, {}).update(map_metrics({"eval/step": rollout_id, **extra_metrics}))

    def log_base_eval(self, args: Any, data: dict, extra_metrics: dict) -> None:
        self._require_open()
        if self.hooks.eval is not None and self.hooks.eval(0, args, data, extra_metrics):
            return
        metrics = map_metrics({**extra_metrics, "eval/step": 0})
        self.journal.append(JournalLine(BASE_EVAL_ROLLOUT_ID, time.time(), metrics))
        print(format_eval("base eval", {k: v for k, v in metrics.items() if k != "eval/step"}), flush=True)

    def recorded(self, rollout_id: int) -> bool:
        return rollout_id in self.journal.recorded

    def record(self, rollout_id: int, metrics: dict[str, float]) -> None:
        self._require_open()
        if self.delivery is not None:
            self.delivery.check()  # a delivery process that died is reported once
        merged = self.line_for(rollout_id, metrics)
        self.pending.pop(rollout_id, None)
        first = self.journal.append(JournalLine(rollout_id, time.time(), merged))
        row = format_row(rollout_id, self.config.rollout.num_rollout, merged, self.config.train.use_kl_loss)
        # a redo after a crash: the journal and the trackers keep the rollout's first line
        print(row if first else f"{row} (redone; kept in {self.journal.redone_path})", flush=True)

    def line_for(self, rollout_id: int, metrics: dict[str, float]) -> dict[str, float]:
        """The journal line `record(rollout_id, metrics)` would write now (what the health watch judges
        before the iteration is recorded, so its verdicts join the same line)."""
        return {**self.pending.get(rollout_id, {}), **map_metrics(metrics)}

    def close(self, final: bool = True) -> FinishReport:
        """`final=False` ends this process's part of a run that goes on elsewhere (a training chunk):
        the journal is delivered and the tracker runs finished, but the report and artifacts
        wait for the final close (a chunk boundary should cost no more than it must). A tracker
        never opened (its loop failed before `open`) closes as a no-op."""
        if self.closed:
            return FinishReport()
        self.closed = True
        if not self.opened:  # its loop failed before `open`: the delivery process just leaves
            self.trainer_file.close = {"session": self.session, "final": False, "timeout": 0.0}
            self.trainer_file.save()
            if self.delivery is not None:
                self.delivery.wait(0.0)
            return FinishReport()
        if final:
            files = [self.run_dir / CONFIG_ARTIFACT, self.journal.path]
            if self.journal.lines:
                files.append(write_report(self.journal.lines, self.run_dir / REPORT_NAME,
                                          clip_grad=self.config.train.clip_grad, title=str(self.run_dir.name)))
            files += [self.run_dir / d for d in PROFILER_DIRS if (self.run_dir / d).is_dir()]
            self.trainer_file.artifacts = [str(f) for f in files]  # for `miles replay-spool` if delivery falls short
        timeout = self.config.tracking.tracking_close_timeout
        self.trainer_file.close = {"session": self.session, "final": final, "timeout": timeout}
        self.trainer_file.save()
        if self.delivery is not None:
            self.delivery.wait(timeout)
        return spooled(self.run_dir, list(self.specs), len(self.journal.lines)) if self.specs else FinishReport()


def build_run_tracker(config: Any, run_dir: Path) -> RunTracker:
    return RunTracker(config, run_dir)
