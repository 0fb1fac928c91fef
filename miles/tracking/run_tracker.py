"""The tracker the training loop talks to: stdout row and journal on the training thread; every
tracker fed from the journal, line by line as it is recorded, by a separate delivery process
(`miles replay-spool RUN_DIR --follow`).

The contract, in the loop's order: `open(extra)` once the checkpoint is read (`open({})` for a
fresh run); per rollout `log_rollout` (after generation, before training) and `record`; the
checkpoint stores `checkpoint_extra()`; `close` at the end. A rollout's journal line is written
once: one redone after a crash keeps its first line, so no tracker point is ever doubled or
changed after it was shown.
"""
from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import Any

import yaml

from miles.config.secrets import public_params, scrubber_for
from miles.health.report import REPORT_NAME, write_report
from miles.record import layout
from miles.record.eval_prompts import write_eval_prompts
from miles.record.journal import BASE_EVAL_ROLLOUT_ID, Journal, JournalLine
from miles.record.names import map_metrics
from miles.record.row import format_eval, format_row, progress
from miles.record.samples import samples_due, write_samples
from miles.config.run_info import describe, run_name, run_tags
from miles.tracking.delivery_process import DeliveryProcess
from miles.tracking.hooks import EVAL_FLAG, ROLLOUT_FLAG, load_hooks
from miles.tracking.sinks.base import SinkSpec
from miles.tracking.sinks.wandb_sink import new_run_id, resolve_mode
from miles.tracking.state import CONFIG_ARTIFACT, DeliveryState, TrainerFile, spooled
from miles.config.mlflow_store import artifact_dir as mlflow_artifact_dir

log = logging.getLogger("miles.tracking")
PROFILER_DIRS = (layout.PROFILER,)  # under RUN_DIR, uploaded when present


def build_specs(config: Any, run_dir: Path, extra: dict) -> dict[str, SinkSpec]:
    """The spec of every tracker that is on (`config` is resolved: its tracker locations are set). A run
    id comes from its flag, else the checkpoint's `extra`, else the run dir's delivery state (same run
    dir, same runs)."""
    t, before = config.tracking, DeliveryState.load(run_dir).sinks

    def known(name: str) -> str | None:
        return extra.get(f"{name}_run_id") or (before[name].spec.options.get("run_id") if name in before else None)

    specs: dict[str, SinkSpec] = {}
    if t.use_wandb:
        specs["wandb"] = SinkSpec("wandb", dict(
            run_id=t.wandb_run_id or known("wandb") or new_run_id(), directory=str(t.wandb_dir),
            mode=resolve_mode(t.wandb_mode, t.wandb_key), project=t.wandb_project, group=t.wandb_group,
            entity=t.wandb_team, run_name=None))
    if t.use_mlflow:
        uri = t.mlflow_tracking_uri
        specs["mlflow"] = SinkSpec("mlflow", dict(
            tracking_uri=uri, experiment=t.mlflow_experiment_name, run_id=t.mlflow_run_id or known("mlflow"),
            run_name=t.mlflow_run_name or run_name(run_dir), artifact_dir=mlflow_artifact_dir(uri, run_dir),
            tags=run_tags(config, run_dir), description=describe(config, run_dir),
            system_metrics=t.mlflow_system_metrics))
    if t.use_tensorboard:
        specs["tensorboard"] = SinkSpec("tensorboard", dict(log_dir=str(t.tensorboard_dir)))
    return specs


def relative_to_run_dir(path: Path, run_dir: Path) -> str:
    """`path` relative to `run_dir` when it lies inside it, else as given."""
    try:
        return str(Path(path).relative_to(run_dir))
    except ValueError:
        return str(path)


class RunTracker:
    def __init__(self, config: Any, run_dir: Path):
        self.hooks = load_hooks(config.tracking)  # a bad hook fails before anything is written
        self.config, self.run_dir = config, Path(run_dir)
        self.scrubber = scrubber_for(config)
        self.params = public_params(config, self.scrubber)
        (self.run_dir / CONFIG_ARTIFACT).parent.mkdir(parents=True, exist_ok=True)
        (self.run_dir / CONFIG_ARTIFACT).write_text(yaml.safe_dump(self.params, sort_keys=True))
        self.journal = Journal(self.run_dir)
        self.pending: dict[int, dict[str, float]] = {}  # default rollout/eval metrics awaiting their record
        self.opened = self.closed = False
        # The delivery process starts now, so it imports the trackers (and creates a local MLflow
        # store) while the trainer starts; it opens their runs once `open` passed the checkpoint's ids.
        self.session = secrets.token_hex(8)
        self.specs = build_specs(config, self.run_dir, {})
        self.trainer_file = TrainerFile.load(self.run_dir)
        self.trainer_file.trackers = dict(self.specs)
        self.trainer_file.claim(self.session)
        self.trainer_file.save()
        self.delivery: DeliveryProcess | None = None  # None with every tracker off, or when it could not start
        if self.specs:
            t = config.tracking
            try:
                self.delivery = DeliveryProcess(self.run_dir, self.session, t.tracking_retry_interval,
                                                self.scrubber.secrets, t.wandb_key,
                                                t.mlflow_tracking_uri if t.use_mlflow else None)
            except OSError as exc:  # training goes on without it
                log.warning("tracking: cannot start the delivery process (%s); training goes on, the journal's "
                            "points stay spooled for `miles replay-spool %s`", self.scrubber.scrub(str(exc)),
                            self.run_dir)

    def _require_open(self) -> None:
        if not self.opened:
            raise RuntimeError("the tracker is not open: call open(extra) once the checkpoint is read "
                               "(open({}) for a fresh run)")

    def open(self, extra: dict[str, Any]) -> None:
        """Let delivery open the tracker runs, reattaching those whose ids are in `extra` (the
        checkpoint's `checkpoint_extra()`)."""
        if self.opened or self.closed:
            raise RuntimeError("open() opens the tracker once per process; it is already open or closed")
        self.specs = build_specs(self.config, self.run_dir, extra or {})
        self.trainer_file.trackers = dict(self.specs)
        self.trainer_file.trainer["open"] = self.opened = True
        self.trainer_file.save()

    def checkpoint_extra(self) -> dict[str, Any]:
        """What a checkpoint stores for `open`: the tracker run ids."""
        self._require_open()
        known = DeliveryState.load(self.run_dir).sinks  # the delivery process fills in run ids as it opens
        ids = {name: spec.options.get("run_id") or (known[name].spec.options.get("run_id") if name in known else None)
               for name, spec in self.specs.items()}
        return {f"{name}_run_id": run_id for name, run_id in ids.items() if run_id}

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

    def _hook(self, hook, flag: str, rollout_id: int, *args: Any) -> bool:
        """Call a custom logger; whether it replaced the default logging. A logger that raises is the
        user's code failing at logging, not the run failing: a warning naming its flag, and the default
        logging takes over for that rollout, so its metrics still reach the journal and the trackers."""
        if hook is None:
            return False
        try:
            return bool(hook(rollout_id, *args))
        except Exception as exc:  # any error of user code; the run goes on
            path = getattr(self.config.tracking, flag.lstrip("-").replace("-", "_"))
            log.warning("tracking: the custom logger %s (%s) raised at rollout %d: %s: %s; this rollout is "
                        "logged the default way", path, flag, rollout_id, type(exc).__name__,
                        self.scrubber.scrub(" ".join(str(exc).split()))[:300])
            return False

    def log_rollout(self, rollout_id: int, args: Any, samples: list, extra_metrics: dict,
                    rollout_time: float) -> None:
        """Miles' custom rollout logger, then the default logging unless it returned True: the loop's
        `rollout/` and `passrate/` metrics (`extra_metrics`) join the rollout's line, and every
        `--log-samples-interval`-th rollout its samples table."""
        self._require_open()
        if samples_due(self.config.tracking.log_samples_interval, rollout_id, self.config.rollout.num_rollout) \
                and not self.recorded(rollout_id):
            write_samples(self.run_dir, rollout_id, samples)
        if self._hook(self.hooks.rollout, ROLLOUT_FLAG, rollout_id, args, samples, extra_metrics, rollout_time):
            return  # Miles: True means the custom logger replaced the default one
        self.pending.setdefault(rollout_id, {}).update(map_metrics(extra_metrics))

    def log_eval(self, rollout_id: int, args: Any, data: dict, extra_metrics: dict) -> None:
        """Miles' custom eval logger, likewise for the loop's `eval/` metrics of `data`."""
        self._require_open()
        if self._hook(self.hooks.eval, EVAL_FLAG, rollout_id, args, data, extra_metrics):
            return
        if not self.recorded(rollout_id):  # a redone rollout keeps its first eval's prompts, as its line
            write_eval_prompts(self.run_dir, rollout_id, rollout_id, data)
        self.pending.setdefault(rollout_id, {}).update(map_metrics({"eval/step": rollout_id, **extra_metrics}))

    def log_base_eval(self, args: Any, data: dict, extra_metrics: dict) -> None:
        """The eval of the starting weights: the eval logger (as rollout 0), then, unless it returned
        True, a journal line of its own at `eval/step` 0 (rollout id -1: before rollout 0)."""
        self._require_open()
        if self._hook(self.hooks.eval, EVAL_FLAG, 0, args, data, extra_metrics):
            return
        metrics = map_metrics({**extra_metrics, "eval/step": 0})
        write_eval_prompts(self.run_dir, BASE_EVAL_ROLLOUT_ID, 0, data)
        self.journal.append(JournalLine(BASE_EVAL_ROLLOUT_ID, time.time(), metrics))
        print(format_eval("base eval", {k: v for k, v in metrics.items() if k != "eval/step"}), flush=True)

    def recorded(self, rollout_id: int) -> bool:
        """Whether the rollout has its journal line (then a redo keeps its line, samples and token file)."""
        return rollout_id in self.journal.recorded

    def line_for(self, rollout_id: int, metrics: dict[str, float]) -> dict[str, float]:
        """The journal line `record` would write now (what the health watch judges first, so that its
        verdicts join the same line)."""
        return {**self.pending.get(rollout_id, {}), **map_metrics(metrics)}

    def record(self, rollout_id: int, metrics: dict[str, float]) -> None:
        """The stdout row and the journal line of one iteration (a redone rollout's line goes to
        `tracking/redone.jsonl`)."""
        self._require_open()
        if self.delivery is not None:
            self.delivery.check()  # a delivery process that died is reported once
        merged = self.line_for(rollout_id, metrics)
        self.pending.pop(rollout_id, None)
        first = self.journal.append(JournalLine(rollout_id, time.time(), merged))
        elapsed, left = progress(self.journal.lines, self.config.rollout.num_rollout, time.time())
        row = format_row(rollout_id, self.config.rollout.num_rollout, merged, self.config.train.use_kl_loss,
                         elapsed, left)
        print(row if first else f"{row} (redone; kept in {self.journal.redone_path})", flush=True)

    def close(self, final: bool = True) -> dict[str, int]:
        """Deliver the rest of the journal and finish the tracker runs; when `final`, write the run
        report and upload the artifacts first (`final=False`: a training chunk, the run goes on in
        another process). Returns the lines still spooled per tracker. A tracker never opened (its
        loop failed before `open`) closes as a no-op."""
        if self.closed:
            return {}
        self.closed = True
        if final and self.opened:
            files = [self.run_dir / CONFIG_ARTIFACT, self.journal.path]
            if self.journal.lines:
                files.append(write_report(self.journal.lines, self.run_dir / REPORT_NAME,
                                          clip_grad=self.config.train.clip_grad, title=str(self.run_dir.name)))
            files += [self.run_dir / d for d in PROFILER_DIRS if layout.has_traces(self.run_dir / d)]  # not pids alone
            # relative to the run dir (for `miles replay-spool` if delivery falls short): a copy of the run dir
            # elsewhere still names its own files
            self.trainer_file.artifacts = [relative_to_run_dir(f, self.run_dir) for f in files]
        timeout = self.config.tracking.tracking_close_timeout if self.opened else 0.0
        self.trainer_file.close = {"session": self.session, "final": final and self.opened, "timeout": timeout}
        self.trainer_file.save()
        if self.delivery is not None:
            self.delivery.wait(timeout)
        return spooled(self.run_dir, list(self.specs), len(self.journal.lines)) if self.opened else {}
