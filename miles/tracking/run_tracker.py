"""The run tracker behind `open_tracking`: stdout row and journal on the training thread,
every tracker fed from committed journal lines by the background delivery worker."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import yaml

from miles.tracking.delivery import DeliveryWorker, FinishReport
from miles.tracking.hooks import load_hooks
from miles.tracking.journal import Journal, JournalLine
from miles.tracking.names import map_metrics
from miles.tracking.report import REPORT_NAME, write_report
from miles.tracking.row import format_row
from miles.tracking.samples import existing_samples, write_samples
from miles.tracking.secrets import public_params, scrubber_for
from miles.tracking.sinks.base import NullSink, Sink
from miles.tracking.sinks.mlflow_sink import MlflowSink, default_tracking_uri
from miles.tracking.sinks.tensorboard_sink import TensorBoardSink
from miles.tracking.sinks.wandb_sink import WandbSink, new_run_id, resolve_mode
from miles.tracking.state import TrackingState

log = logging.getLogger("miles.tracking")
CONFIG_ARTIFACT = Path("tracking") / "config.yaml"
PROFILER_DIRS = ("profiler", "profiles", "traces")  # under RUN_DIR, uploaded when present


def build_sinks(config: Any, run_dir: Path, params: dict, state: TrackingState, extra: dict) -> list[Sink]:
    """One sink per tracker, the null sink where it is off. A run id comes from its flag, else
    the checkpoint's `extra`, else the run dir's tracking state (same run dir, same runs)."""
    t = config.tracking

    def known(name: str, option: str) -> str | None:
        previous = state.sinks.get(name)
        return extra.get(f"{name}_run_id") or (previous.spec.options.get(option) if previous else None)

    wandb: Sink = NullSink()
    if t.use_wandb:
        wandb = WandbSink(params, run_id=t.wandb_run_id or known("wandb", "run_id") or new_run_id(),
                          directory=str(t.wandb_dir or run_dir), mode=resolve_mode(t.wandb_mode, t.wandb_key),
                          project=t.wandb_project, group=t.wandb_group, entity=t.wandb_team, api_key=t.wandb_key)
    mlflow: Sink = NullSink()
    if t.use_mlflow:
        uri = t.mlflow_tracking_uri or default_tracking_uri(run_dir)
        local = uri.startswith(("sqlite:", "file:")) or "://" not in uri
        mlflow = MlflowSink(params, tracking_uri=uri, experiment=t.mlflow_experiment_name,
                            run_id=t.mlflow_run_id or known("mlflow", "run_id"), run_name=t.mlflow_run_name,
                            artifact_dir=str(run_dir / "mlartifacts") if local else None)
    tensorboard: Sink = NullSink()
    if t.use_tensorboard:
        tensorboard = TensorBoardSink(params, log_dir=str(t.tensorboard_dir or run_dir / "tensorboard"))
    for name, sink in (("wandb", wandb), ("mlflow", mlflow), ("tensorboard", tensorboard)):
        sink.name = name  # a null sink stands in under the tracker's name
    return [wandb, mlflow, tensorboard]


class RunTracker:
    """Implements `miles.tracking.protocol.RunTracker`."""

    def __init__(self, config: Any, run_dir: Path):
        self.hooks = load_hooks(config.tracking)  # a bad hook fails before anything is written
        self.config, self.run_dir = config, Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.scrubber = scrubber_for(config)
        self.params = public_params(config, self.scrubber)
        self.journal = Journal(self.run_dir)
        self.state = TrackingState.load(self.run_dir)
        self.pending: dict[int, dict[str, float]] = {}  # default rollout/eval metrics awaiting their record
        self.worker: DeliveryWorker | None = None
        self.closed = False
        self._write_config()

    def _write_config(self) -> None:
        path = self.run_dir / CONFIG_ARTIFACT
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.params, sort_keys=True))

    def _start(self, extra: dict[str, Any]) -> DeliveryWorker:
        if self.worker is None:
            sinks = build_sinks(self.config, self.run_dir, self.params, self.state, extra)
            self.worker = DeliveryWorker(sinks, self.state, self.journal.lines,
                                         lambda rid: existing_samples(self.run_dir, rid), self.scrubber,
                                         retry_interval=self.config.tracking.tracking_retry_interval)
            self.state.save()
            self.worker.start()
            self.worker.submit()  # open the trackers now, so their run ids exist early
        return self.worker

    # -- the contract -----------------------------------------------------------
    def resume(self, committed_rollout_id: int | None, extra: dict[str, Any]) -> None:
        if self.worker is not None:
            raise RuntimeError("resume() must come before the first record/commit of this process")
        self.journal.truncate_after(committed_rollout_id)
        self.state.committed = len(self.journal.lines)
        for name, sink_state in self.state.sinks.items():
            if sink_state.cursor > self.state.committed:
                log.warning("tracking: %s already holds %d lines past checkpoint %s; the redone rollouts will "
                            "appear twice there", name, sink_state.cursor - self.state.committed,
                            committed_rollout_id)
                sink_state.cursor = self.state.committed
        self.pending.clear()
        self._start(extra or {})

    def wait_open(self, timeout: float) -> None:
        """Block until every tracker run is open (benchmarks and tests that time or kill delivery)."""
        worker = self._start({})
        deadline = time.monotonic() + timeout
        while not all(slot.opened for slot in worker.slots):
            if time.monotonic() > deadline:
                raise TimeoutError(f"trackers not open after {timeout}s")
            time.sleep(0.05)  # poll interval, bounded by the deadline

    def checkpoint_extra(self) -> dict[str, Any]:
        worker = self._start({})
        return {f"{slot.name}_run_id": slot.state.spec.options["run_id"] for slot in worker.slots
                if slot.state.spec.options.get("run_id")}

    def log_rollout(self, rollout_id: int, args: Any, samples: list, extra_metrics: dict,
                    rollout_time: float) -> None:
        self._start({})
        interval = self.config.tracking.log_samples_interval
        if interval and rollout_id % interval == 0:
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
        metrics = map_metrics({"eval/step": rollout_id, **extra_metrics})
        if self.journal.lines and self.journal.lines[-1].rollout_id == rollout_id:
            self.journal.append(JournalLine(rollout_id, time.time(), metrics))  # eval after its iteration
        else:
            self.pending.setdefault(rollout_id, {}).update(metrics)

    def record(self, rollout_id: int, metrics: dict[str, float]) -> None:
        self._start({})
        if self.journal.lines and self.journal.lines[-1].rollout_id >= rollout_id:
            if self.journal.count_through(rollout_id - 1) < self.state.committed:
                raise RuntimeError(f"rollout {rollout_id} is already committed to the trackers; "
                                   f"resume from its checkpoint instead of recording it again")
            self.journal.truncate_after(rollout_id - 1)  # an uncommitted redo replaces the old lines
        merged = {**self.pending.pop(rollout_id, {}), **map_metrics(metrics)}
        self.journal.append(JournalLine(rollout_id, time.time(), merged))
        print(format_row(rollout_id, self.config.rollout.num_rollout, merged, self.config.train.use_kl_loss),
              flush=True)

    def commit(self, rollout_id: int) -> None:
        worker = self._start({})
        self.state.committed = max(self.state.committed, self.journal.count_through(rollout_id))
        self.state.save()
        worker.submit()

    def close(self) -> FinishReport:
        if self.closed:
            return FinishReport()
        self.closed = True
        worker = self._start({})
        files = [self.run_dir / CONFIG_ARTIFACT, self.journal.path]
        if self.journal.lines:
            files.append(write_report(self.journal.lines, self.run_dir / REPORT_NAME,
                                      clip_grad=self.config.train.clip_grad, title=str(self.run_dir.name)))
        files += [self.run_dir / d for d in PROFILER_DIRS if (self.run_dir / d).is_dir()]
        return worker.finish(files, timeout=self.config.tracking.tracking_close_timeout)


def build_run_tracker(config: Any, run_dir: Path) -> RunTracker:
    return RunTracker(config, run_dir)
