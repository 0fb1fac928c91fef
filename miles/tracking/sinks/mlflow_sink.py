"""MLflow as a sink: one run in an experiment, the public config as params, metrics per step axis (each
point's step; the axes `train/step`, `rollout/step`, `eval/step` are not logged as metrics themselves).

The experiment carries MLflow's model-training kind (the UI of MLflow 3.17 does not read it: miles'
links and `mlflow ui --app-name miles` open that view, see `mlflow_app`); the run carries the run's
tags and description, and MLflow's system metrics while it is open.

Every point carries the journal line's own timestamp, so a line delivered twice (after a
crash between delivery and cursor save) is the same (key, step, timestamp, value) and
MLflow's SQL store drops the duplicate instead of doubling the point.
"""
from __future__ import annotations

import logging
import os
import time
import urllib.parse
from pathlib import Path
from typing import Any

from miles.health.alerts import red_flags_in
from miles.health.signals import PREFIX as HEALTH_PREFIX
from miles.record.names import STEP_KEYS, step_of
from miles.config.mlflow_store import store_lock
from miles.tracking.sinks.base import Delivery, SinkSpec

# a dead tracking server must fail a call in seconds, not block the delivery worker in
# MLflow's default minutes of retries; the worker does its own retrying
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")

log = logging.getLogger("miles.tracking")
HEALTH_TAG = "miles.health"
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}  # MLflow's "model training, not GenAI"
DESCRIPTION_TAG = "mlflow.note.content"  # shown as the run's description
CPU_FIRST_SAMPLE_S = 0.5  # the span a monitor's first CPU sample is measured over (its later ones: the interval)
NETWORK_BASELINE_TAG = "miles.system.network_baseline_mb"  # received,sent MB when the run's first monitor started
MAX_SAMPLES_UPLOAD = 16 * 2**20  # bytes of one rollout's samples file uploaded as an artifact
MAX_METRICS_PER_BATCH = 1000  # MLflow's log_batch limits
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_LEN = 6000


def local_artifact_path(artifact_uri: str | None) -> Path | None:
    """Where an MLflow artifact URI writes on this machine (a `file:` URI or a bare path; none at all is
    the current directory, as MLflow takes it); None for a remote store (s3:, mlflow-artifacts:, ...)."""
    uri = artifact_uri or ""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme == "file":
        return Path(urllib.parse.unquote(parts.path) or ".").resolve()
    if parts.scheme:
        return None
    return Path(uri or ".").resolve()


def charted_in_mlflow(metrics: dict[str, float]) -> dict[str, float]:
    """What MLflow charts of one journal line: its metrics but
    - the step axes: every point's `step` already (as metrics they were straight-line charts named "step");
    - a `health/<signal>` of 0: a healthy run showed a "health" section of 13 flat zero charts (first-hour
      F3); a red flag is still its 1 at the rollout, and the run's `miles.health.*` tags name it;
    - `eval/<set>` where it equals `eval/<set>-pass_at_1`: the mean of 0/1 rewards is pass@1, one chart twice
      (a reward with other values keeps both, they differ then).
    The journal, wandb and TensorBoard keep every key."""
    out = {}
    for key, value in metrics.items():
        if key in STEP_KEYS or (key.startswith(HEALTH_PREFIX) and value == 0):
            continue
        if key.startswith("eval/") and metrics.get(f"{key}-pass_at_1") == value:
            continue
        out[key] = value
    return out


def _content_error(exc: BaseException) -> bool:
    """Whether a table failed on its data (a value JSON cannot hold, text that is not UTF-8), which no retry
    mends: a ValueError or TypeError, raised as it is or as the cause of MLflow's own error."""
    return any(isinstance(e, (ValueError, TypeError)) for e in (exc, exc.__cause__, exc.__context__))


class MlflowSink:
    name = "mlflow"
    # set by `miles replay-spool`: the directories the server's artifact location may be in when it is on
    # this machine (the run dir, --allow-dir); None: not checked (the run's own delivery process)
    write_roots: list[Path] | None = None

    def __init__(self, params: dict[str, Any], tracking_uri: str, experiment: str, run_id: str | None = None,
                 run_name: str | None = None, artifact_dir: str | None = None, tags: dict[str, str] | None = None,
                 description: str | None = None, system_metrics: bool = False):
        self.params, self.tracking_uri, self.experiment = params, tracking_uri, experiment
        self.run_id, self.run_name, self.artifact_dir = run_id, run_name, artifact_dir
        self.tags, self.description, self.system_metrics = dict(tags or {}), description, system_metrics
        self.client = None
        self.tagged: set[str] = set()  # tags of red flags already on the run
        self.monitor = None  # MLflow's SystemMetricsMonitor thread while the run is open

    def spec(self) -> SinkSpec:
        return SinkSpec("mlflow", dict(tracking_uri=self.tracking_uri, experiment=self.experiment,
                                       run_id=self.run_id, run_name=self.run_name, artifact_dir=self.artifact_dir,
                                       tags=self.tags, description=self.description,
                                       system_metrics=self.system_metrics))

    def prepare(self) -> None:
        from mlflow.tracking import MlflowClient

        with store_lock(self.tracking_uri):  # a store shared by parallel runs is created once
            MlflowClient(tracking_uri=self.tracking_uri).get_experiment_by_name(self.experiment)  # creates a SQLite store

    def open(self) -> None:
        from mlflow.entities import Param, RunStatus
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        if self.run_id is not None:
            run = self.client.get_run(self.run_id)  # raises if the id is unknown to this server
            self._check_artifact_location(run.info.artifact_uri)
            self.tagged = {k for k in run.data.tags if k.startswith(HEALTH_TAG)}
            if run.info.status != RunStatus.to_string(RunStatus.RUNNING):
                self.client.update_run(self.run_id, status="RUNNING")
            self._start_system_metrics(resume=True)
            return
        with store_lock(self.tracking_uri):  # runs sharing a store: one creates the experiment
            experiment = self.client.get_experiment_by_name(self.experiment)
            if experiment is None:
                # a local store keeps artifacts beside it (mlflow_store.artifact_dir), not ./mlruns of whatever cwd
                location = Path(self.artifact_dir).resolve().as_uri() if self.artifact_dir else None
                experiment_id = self.client.create_experiment(self.experiment, artifact_location=location,
                                                              tags=EXPERIMENT_KIND)
        if experiment is not None:
            experiment_id = experiment.experiment_id
            if not any(k in experiment.tags for k in EXPERIMENT_KIND):  # never override a kind a user chose
                for key, value in EXPERIMENT_KIND.items():
                    self.client.set_experiment_tag(experiment_id, key, value)
        tags = {**self.tags, **({DESCRIPTION_TAG: self.description} if self.description else {})}
        run = self.client.create_run(experiment_id, run_name=self.run_name, tags=tags)
        self._check_artifact_location(run.info.artifact_uri)
        params = [Param(k, str(v)[:MAX_PARAM_LEN]) for k, v in sorted(self.params.items())]
        for i in range(0, len(params), MAX_PARAMS_PER_BATCH):
            self.client.log_batch(run.info.run_id, params=params[i:i + MAX_PARAMS_PER_BATCH])
        self.run_id = run.info.run_id
        self._start_system_metrics(resume=False)

    def _check_artifact_location(self, artifact_uri: str | None) -> None:
        """The server decides where a run's artifacts go; a location on this machine outside `write_roots`
        is refused (StateError) before any file is written there."""
        if self.write_roots is None:
            return
        target = local_artifact_path(artifact_uri)
        if target is None or any(target.is_relative_to(root) for root in self.write_roots):
            return
        from miles.tracking.state import StateError

        where = f"{artifact_uri!r:.200}" if artifact_uri else "none (MLflow would write into the current directory)"
        raise StateError(f"tracker 'mlflow': the server {self.tracking_uri!r:.200} gives the run the artifact "
                         f"location {where}: {target} is on this machine, outside the run dir; "
                         f"replay-spool writes only inside it (pass --allow-dir DIR to allow DIR)")

    def _start_system_metrics(self, resume: bool) -> None:
        """MLflow's own sampler (CPU, memory, disk, network; GPU with nvidia-ml-py) as `system/*` metrics,
        on their own step axis; a resumed run continues its steps."""
        if not self.system_metrics or self.monitor is not None:
            return
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        self.monitor = SystemMetricsMonitor(self.run_id, resume_logging=resume, tracking_uri=self.tracking_uri)
        self._continue_network_counters(resume)
        self._measure_first_cpu_sample()
        self.monitor.start()

    def _measure_first_cpu_sample(self) -> None:
        """psutil's cpu_percent() compares with the calling thread's previous call (psutil 7 keeps one per
        thread) and answers 0.0 on a thread's first, and each chunk starts a monitor thread: every chunk's
        first CPU sample read 0.0 (5 of 9 samples of the first-hour run, F2), although this process primed
        psutil in its own thread. The monitor thread's first sample is measured over CPU_FIRST_SAMPLE_S."""
        cpu = next((m for m in getattr(self.monitor, "monitors", ()) if type(m).__name__ == "CPUMonitor"), None)
        if cpu is None:
            return
        collect = cpu.collect_metrics
        shutdown = getattr(self.monitor, "_shutdown_event", None)

        def first_collect() -> None:
            import psutil

            cpu.collect_metrics = collect  # the next samples compare with this one, a sampling interval apart
            psutil.cpu_percent()  # this thread's starting point
            if shutdown is not None:
                shutdown.wait(CPU_FIRST_SAMPLE_S)  # a chunk closing meanwhile is not held up
            else:
                time.sleep(CPU_FIRST_SAMPLE_S)
            collect()

        cpu.collect_metrics = first_collect

    def _continue_network_counters(self, resume: bool) -> None:
        """MLflow's network metrics count bytes from the monitor's start, and each chunk starts a monitor:
        they fell to 0 at every chunk. The run's first monitor keeps its starting counters as a run tag,
        and a resumed monitor counts from them, so `system/network_*` grows over the whole run."""
        network = next((m for m in getattr(self.monitor, "monitors", ()) if type(m).__name__ == "NetworkMonitor"
                        and hasattr(m, "_initial_receive_megabytes")), None)
        if network is None:  # another MLflow's monitor: its counters restart per chunk, as before
            return
        if not resume:
            self.client.set_tag(self.run_id, NETWORK_BASELINE_TAG,
                                f"{network._initial_receive_megabytes:.6f},{network._initial_transmit_megabytes:.6f}")
            return
        try:
            recv, sent = map(float, self.client.get_run(self.run_id).data.tags[NETWORK_BASELINE_TAG].split(","))
        except (KeyError, ValueError):
            return  # a run begun before this tag existed
        if recv <= network._initial_receive_megabytes and sent <= network._initial_transmit_megabytes:
            network._initial_receive_megabytes, network._initial_transmit_megabytes = recv, sent  # not across a reboot

    def durable_cursor(self, recorded: int) -> int:
        return recorded  # redelivery is harmless (see the module docstring)

    def deliver(self, delivery: Delivery) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(key, value, int(line.time * 1000), step_of(key, line.metrics, line.rollout_id))
                   for line in delivery.lines for key, value in charted_in_mlflow(line.metrics).items()]
        for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + MAX_METRICS_PER_BATCH])
        for path in delivery.samples.values():
            self._log_samples_file(path)
            try:
                self._log_sample_table(path)
            except Exception as exc:
                if not _content_error(exc):
                    raise  # an outage: retried with the lines
                # what the table holds: raising would keep this line and every later one spooled for good,
                # each retry failing alike (probe ST1); the samples file itself went up above
                log.warning("tracking: mlflow: no sample table for %s (%s: %.300s); the metrics are delivered",
                            path.name, type(exc).__name__, " ".join(str(exc).split()))
        self._tag_red_flags(delivery)

    def _log_samples_file(self, path: Path) -> None:
        """The rollout's samples file as an artifact, up to MAX_SAMPLES_UPLOAD bytes: a rollout of long
        responses made one of 45 MB a rollout (ST3); past the bound the bounded table stands for it, and
        the file stays in the run dir."""
        size = path.stat().st_size
        if size <= MAX_SAMPLES_UPLOAD:
            self.client.log_artifact(self.run_id, str(path), "samples")
            return
        log.warning("tracking: mlflow: %s is %.1f MiB, more than %.0f MiB: not uploaded (its sample table is; the "
                    "file stays in RUN_DIR/samples/)", path.name, size / 2**20, MAX_SAMPLES_UPLOAD / 2**20)

    def _log_sample_table(self, path: Path) -> None:
        """The rollout's samples as an MLflow table artifact (the UI's evaluation view). log_table appends to
        an existing file, so a redelivered rollout (after an outage) is logged only if it is not there yet."""
        from miles.record.sample_table import sample_table

        artifact = f"samples/{path.stem}.table.json"
        if any(f.path == artifact for f in self.client.list_artifacts(self.run_id, "samples")):
            return
        columns, rows = sample_table(path)
        self.client.log_table(self.run_id, {c: [r[i] for r in rows] for i, c in enumerate(columns)}, artifact)

    def _tag_red_flags(self, delivery: Delivery) -> None:
        """`miles.health.<signal>`: the first rollout a red flag was raised on; `miles.health`: red."""
        for line in delivery.lines:
            for signal in red_flags_in(line.metrics):
                tag = f"{HEALTH_TAG}.{signal}"
                if tag not in self.tagged:
                    self.client.set_tag(self.run_id, tag, f"red flag at rollout {line.rollout_id}")
                    self.client.set_tag(self.run_id, HEALTH_TAG, "red")
                    self.tagged.add(tag)

    def alert_live(self, verdict) -> None:
        """A red flag raised while its rollout still runs (a hung phase): tagged as it is raised."""
        tag = f"{HEALTH_TAG}.{verdict.signal}"
        if tag not in self.tagged:
            self.client.set_tag(self.run_id, tag, f"live red flag at rollout {verdict.rollout_id}: {verdict.message}")
            self.client.set_tag(self.run_id, HEALTH_TAG, "red")
            self.tagged.add(tag)

    def upload(self, files: list[Path]) -> None:
        for path in files:
            if path.is_dir():
                self.client.log_artifacts(self.run_id, str(path), path.name)
            elif path.is_file():
                self.client.log_artifact(self.run_id, str(path))

    def close(self) -> None:
        if self.monitor is not None:
            monitor, self.monitor = self.monitor, None
            monitor.finish()
            # the samples taken since its last publish (all of them, for a run shorter than one
            # sampling interval) go out while the run is still RUNNING
            monitor.publish_metrics(monitor.aggregate_metrics())
            monitor.mlflow_logger.flush()
        if self.client is not None and self.run_id is not None:
            self.client.set_terminated(self.run_id)
