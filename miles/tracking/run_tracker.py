"""The run tracker behind `open_tracking`: stdout row and journal on the training thread;
every tracker fed from committed journal lines by a separate, niced delivery process
(`miles.tracking.delivery_process`), started when the first tracker is on."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import yaml

from miles.run_info import describe, run_name, run_tags
from miles.tracking.delivery import FinishReport
from miles.tracking.delivery_process import DeliveryProcess, spooled
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
from miles.tracking.state import CONFIG_ARTIFACT, CommitState, DeliveryState

log = logging.getLogger("miles.tracking")
PROFILER_DIRS = ("profiler", "profiles", "traces")  # under RUN_DIR, uploaded when present
__all__ = ["CONFIG_ARTIFACT", "RunTracker", "build_run_tracker", "build_specs"]


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
        self.commits = CommitState.load(self.run_dir)
        self.pending: dict[int, dict[str, float]] = {}  # default rollout/eval metrics awaiting their record
        self.started = False
        self.specs: dict[str, SinkSpec] = {}  # the trackers that are on
        self.delivery: DeliveryProcess | None = None  # None while not started, with every tracker off, or
        # when the delivery process could not be started (its points then stay spooled)
        self.closed = False
        self._write_config()

    def _write_config(self) -> None:
        path = self.run_dir / CONFIG_ARTIFACT
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.params, sort_keys=True))

    def _start(self, extra: dict[str, Any]) -> DeliveryProcess | None:
        """Start delivery once: the child opens the trackers at once, so their run ids exist early."""
        if not self.started:
            self.started = True
            self.specs = build_specs(self.config, self.run_dir, DeliveryState.load(self.run_dir), extra)
            self.commits.trackers = dict(self.specs)
            self.commits.save()
            if self.specs:
                t = self.config.tracking
                try:
                    self.delivery = DeliveryProcess(
                        self.run_dir, self.specs, committed=self.commits.committed,
                        retry_interval=t.tracking_retry_interval, secrets=self.scrubber.secrets,
                        secret_options={"wandb": {"api_key": t.wandb_key}} if t.wandb_key and "wandb" in self.specs
                        else {})
                except OSError as exc:  # training goes on without it
                    log.warning("tracking: cannot start the delivery process (%s); training goes on, the committed "
                                "points stay spooled for `miles replay-spool %s`", self.scrubber.scrub(str(exc)),
                                self.run_dir)
        return self.delivery

    @property
    def delivery_pid(self) -> int | None:
        """The delivery process's pid (None with every tracker off)."""
        delivery = self._start({})
        return delivery.pid if delivery is not None else None

    # -- the contract -----------------------------------------------------------
    def resume(self, committed_rollout_id: int | None, extra: dict[str, Any]) -> None:
        if self.started:
            raise RuntimeError("resume() must come before the first record/commit of this process")
        self.journal.truncate_after(committed_rollout_id)
        self.commits.committed = len(self.journal.lines)  # the delivery process cuts cursors past it back
        self.pending.clear()
        self._start(extra or {})

    def wait_open(self, timeout: float) -> None:
        """Block until every tracker run is open (benchmarks and tests that time or kill delivery);
        TimeoutError after `timeout`, DeliveryProcessError if the delivery process is gone."""
        delivery = self._start({})
        if delivery is not None:
            delivery.wait_open(timeout)

    def checkpoint_extra(self) -> dict[str, Any]:
        delivery = self._start({})
        specs = dict(delivery.specs if delivery is not None else self.specs)  # the child fills in run ids
        return {f"{name}_run_id": spec.options["run_id"] for name, spec in specs.items()
                if spec.options.get("run_id")}

    def log_rollout(self, rollout_id: int, args: Any, samples: list, extra_metrics: dict,
                    rollout_time: float) -> None:
        self._start({})
        if samples_due(self.config.tracking.log_samples_interval, rollout_id):
            write_samples(self.run_dir, rollout_id, samples)
        if self.hooks.rollout is not None and self.hooks.rollout(rollout_id, args, samples, extra_metrics,
                                                                 rollout_time):
            return  # Miles: True means the custom logger replaced the default one
        # The default logging records the rollout metrics the loop computed from these samples
        # (miles.rollout.metrics is their one source); samples also feed the table and the hooks.
        self.pending.setdefault(rollout_id, {}).update(map_metrics(extra_metrics))

    def log_eval(self, rollout_id: int, args: Any, data: dict, extra_metrics: dict) -> None:
        self._start({})
        if self.hooks.eval is not None and self.hooks.eval(rollout_id, args, data, extra_metrics):
            return
        # recorded with the iteration's line (the loop evaluates before it records)
        self.pending.setdefault(rollout_id, {}).update(map_metrics({"eval/step": rollout_id, **extra_metrics}))

    def log_base_eval(self, args: Any, data: dict, extra_metrics: dict) -> None:
        self._start({})
        if self.hooks.eval is not None and self.hooks.eval(0, args, data, extra_metrics):
            return
        metrics = map_metrics({**extra_metrics, "eval/step": 0})
        self.journal.append(JournalLine(BASE_EVAL_ROLLOUT_ID, time.time(), metrics))
        print(format_eval("base eval", {k: v for k, v in metrics.items() if k != "eval/step"}), flush=True)

    def record(self, rollout_id: int, metrics: dict[str, float]) -> None:
        self._start({})
        if self.journal.lines and self.journal.lines[-1].rollout_id >= rollout_id:
            if self.journal.count_through(rollout_id - 1) < self.commits.committed:
                raise RuntimeError(f"rollout {rollout_id} is already committed to the trackers; "
                                   f"resume from its checkpoint instead of recording it again")
            self.journal.truncate_after(rollout_id - 1)  # an uncommitted redo replaces the old lines
        merged = self.line_for(rollout_id, metrics)
        self.pending.pop(rollout_id, None)
        self.journal.append(JournalLine(rollout_id, time.time(), merged))
        print(format_row(rollout_id, self.config.rollout.num_rollout, merged, self.config.train.use_kl_loss),
              flush=True)

    def line_for(self, rollout_id: int, metrics: dict[str, float]) -> dict[str, float]:
        """The journal line `record(rollout_id, metrics)` would write now (what the health watch judges
        before the iteration is recorded, so its verdicts join the same line)."""
        return {**self.pending.get(rollout_id, {}), **map_metrics(metrics)}

    def commit(self, rollout_id: int) -> None:
        delivery = self._start({})
        self.commits.committed = max(self.commits.committed, self.journal.count_through(rollout_id))
        self.commits.save()
        if delivery is not None:
            delivery.commit(self.commits.committed)  # never blocks: the child reads the lines from disk

    def close(self, final: bool = True) -> FinishReport:
        """`final=False` ends this process's part of a run that goes on elsewhere (a training chunk):
        committed lines are delivered and the tracker runs finished, but the report and artifacts
        wait for the final close (a chunk boundary should cost no more than it must)."""
        if self.closed:
            return FinishReport()
        self.closed = True
        delivery = self._start({})
        files: list[Path] = []
        if final:
            files = [self.run_dir / CONFIG_ARTIFACT, self.journal.path]
            if self.journal.lines:
                files.append(write_report(self.journal.lines, self.run_dir / REPORT_NAME,
                                          clip_grad=self.config.train.clip_grad, title=str(self.run_dir.name)))
            files += [self.run_dir / d for d in PROFILER_DIRS if (self.run_dir / d).is_dir()]
            self.commits.artifacts = [str(f) for f in files]  # for `miles replay-spool` if delivery falls short
            self.commits.save()
        if delivery is None:
            return spooled(self.run_dir, list(self.specs), self.commits.committed) if self.specs else FinishReport()
        return delivery.finish(files, timeout=self.config.tracking.tracking_close_timeout,
                               committed=self.commits.committed, final=final)


def build_run_tracker(config: Any, run_dir: Path) -> RunTracker:
    return RunTracker(config, run_dir)
