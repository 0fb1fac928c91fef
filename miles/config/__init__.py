"""One typed config for the whole system, split into one frozen section per subsystem.

`parse_config(argv)` reads Miles-compatible flags and/or `--config FILE.yaml`; with no
flags at all it gives the tiny CPU setup (the same values as `configs/tiny-cpu.yaml`).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from typing import Any, Callable, NoReturn

from miles.config.engine import EngineConfig
from miles.config.generate import GenerateConfig
from miles.config.fields import ConfigError, flag_name, is_secret_name
from miles.config.health import HealthConfig
from miles.config.orchestration import OrchestrationConfig
from miles.config.parallel import rank_layout
from miles.config.parse import parse_sections
from miles.config.profiling import ProfilingConfig
from miles.config.rollout import RolloutConfig
from miles.config.router import RouterConfig
from miles.config.serve import EngineServeConfig, RouterServeConfig
from miles.config.tracking import TrackingConfig
from miles.config.train import TrainConfig

__all__ = [
    "ConfigError", "MilesConfig", "parse_config", "EngineConfig", "RouterConfig", "RolloutConfig",
    "TrainConfig", "TrackingConfig", "GenerateConfig", "ProfilingConfig", "HealthConfig", "OrchestrationConfig",
    "EngineServeConfig", "RouterServeConfig", "parse_sections", "redacted_flat_dict", "run_main",
]

REDACTED = "***"


@dataclass(frozen=True)
class MilesConfig:
    """Everything a training run needs, one section per subsystem."""

    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    generate: GenerateConfig = dataclasses.field(default_factory=GenerateConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    router: RouterConfig = dataclasses.field(default_factory=RouterConfig)
    tracking: TrackingConfig = dataclasses.field(default_factory=TrackingConfig)
    profiling: ProfilingConfig = dataclasses.field(default_factory=ProfilingConfig)
    health: HealthConfig = dataclasses.field(default_factory=HealthConfig)
    orchestration: OrchestrationConfig = dataclasses.field(default_factory=OrchestrationConfig)

    @property
    def samples_per_rollout(self) -> int:
        return self.rollout.rollout_batch_size * self.rollout.n_samples_per_prompt

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step; Miles derives it from the steps per rollout."""
        if self.train.global_batch_size is not None:
            return self.train.global_batch_size
        return self.samples_per_rollout // self.train.num_steps_per_rollout

    @property
    def world_size(self) -> int:
        return self.train.actor_num_nodes * self.train.actor_num_gpus_per_node

    @property
    def data_parallel_size(self) -> int:
        """Model replicas: the training ranks / (TP x PP); each takes a share of a step's batch."""
        return rank_layout(self.train).dp

    def _fits_the_engine_queue(self) -> None:
        """The samples of one prompt go to one engine as one batched /generate, and up to
        --sglang-server-concurrency samples may be in flight to one engine: the embedded engine answers 503
        to every sample past its --engine-max-queued-requests, so a larger value can only fail mid-run (C11).
        (SGLang's queue is its own; not checked.)"""
        if self.engine.engine == "sglang":
            return
        limit = self.engine.engine_max_queued_requests
        r = self.rollout
        for name, value, why in (("--n-samples-per-prompt", r.n_samples_per_prompt, "the samples of one prompt"),
                                 ("--n-samples-per-eval-prompt", r.n_samples_per_eval_prompt,
                                  "the samples of one eval prompt"),
                                 ("--sglang-server-concurrency", r.sglang_server_concurrency,
                                  "the requests in flight")):
            if value > limit:
                raise ConfigError(name, f"{value} is more than one engine queues (--engine-max-queued-requests "
                                        f"{limit}): {why} go to one engine at once, and every one past its queue "
                                        f"would be refused mid-run; lower it or raise --engine-max-queued-requests")

    def validate(self) -> None:
        """Checks that span sections; each section checks itself when built."""
        samples, gbs = self.samples_per_rollout, self.global_batch_size
        if self.train.global_batch_size is None and samples % self.train.num_steps_per_rollout:
            raise ConfigError("--num-steps-per-rollout", f"must divide rollout-batch-size x n-samples-per-prompt "
                              f"= {samples}, got {self.train.num_steps_per_rollout}")
        if samples % gbs:
            raise ConfigError("--global-batch-size", f"must divide rollout-batch-size x n-samples-per-prompt "
                              f"= {samples}, got {gbs}")
        if self.train.global_batch_size is not None and samples // gbs != self.train.num_steps_per_rollout \
                and self.train.num_steps_per_rollout != 1:
            raise ConfigError("--num-steps-per-rollout", f"{self.train.num_steps_per_rollout} disagrees with "
                              f"--global-batch-size {gbs} ({samples // gbs} steps per rollout)")
        dp = self.data_parallel_size  # TP and PP ranks of one replica train the same samples
        per_rank = gbs // dp if gbs % dp == 0 else None
        if per_rank is None:
            raise ConfigError("--global-batch-size",
                              f"{gbs} must be divisible by the data parallel size ({dp} = "
                              f"--actor-num-nodes x --actor-num-gpus-per-node / (TP x PP))")
        micro = min(self.train.micro_batch_size, per_rank)
        if per_rank % micro:
            raise ConfigError("--micro-batch-size", f"{self.train.micro_batch_size} must divide the per-rank "
                              f"global batch ({gbs} / {dp} data parallel ranks = {per_rank})")
        if self.train.use_kl_loss and self.train.kl_loss_coef == 0.0:
            raise ConfigError("--kl-loss-coef", "must be > 0 with --use-kl-loss")
        gpus = self.rollout.rollout_num_gpus_per_engine
        if gpus != 1 and self.engine.engine != "sglang":
            raise ConfigError("--rollout-num-gpus-per-engine", f"the embedded engine runs on one device, got {gpus}; "
                                                               "several GPUs per engine need --engine sglang")
        if gpus != 1 and self.engine.sglang_tp_size not in (1, gpus):
            raise ConfigError("--sglang-tp-size", f"{self.engine.sglang_tp_size} disagrees with "
                                                  f"--rollout-num-gpus-per-engine {gpus} (one GPU per TP rank)")
        self._fits_the_engine_queue()
        if self.rollout.tiny_policy == "moe" and self.generate.custom_generate_function_path:
            raise ConfigError("--tiny-policy", "moe is made for the addition task; the multi-turn "
                                               "calculator task (--custom-generate-function-path) has "
                                               "a dense tiny model only")
        if self.rollout.n_samples_per_prompt == 1 and self.train.advantage_estimator == "grpo":
            raise ConfigError("--n-samples-per-prompt", "GRPO needs groups of at least 2 samples per prompt")
        t = self.tracking
        if t.mlflow_ui and not t.use_mlflow:
            raise ConfigError("--mlflow-ui", "needs --use-mlflow (it serves the run's MLflow store)")
        if t.mlflow_ui and (t.mlflow_tracking_uri or "").startswith(("http://", "https://")):
            raise ConfigError("--mlflow-ui", f"--mlflow-tracking-uri {t.mlflow_tracking_uri} is a tracking server "
                                             "with its own UI; --mlflow-ui serves a local store")
        broadcast = self.train.update_weight_transfer_mode == "broadcast"
        if broadcast and self.engine.engine == "sglang":
            raise ConfigError("--update-weight-transfer-mode",
                              "broadcast is built for the embedded engine (gloo); SGLang on GPU "
                              "needs NCCL, not built yet: use disk")
        if self.orchestration.use_fault_tolerance and self.train.colocate:
            raise ConfigError("--use-fault-tolerance", "needs the weights on disk to bring a relaunched engine up to "
                                                       "date; --colocate pushes them in memory")
        self.profiling.validate_run(self.rollout.num_rollout, self.world_size, {
            "--run-dir": self.train.run_dir or ".", "--tensorboard-dir": self.tracking.tensorboard_dir})

    def sections(self) -> list[Any]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]

    def as_namespace(self) -> argparse.Namespace:
        """Flat Miles-style `args` (args.rollout_batch_size, ...) for hooks written for Miles."""
        flat = {}
        for section in self.sections():
            flat.update(dataclasses.asdict(section))
        flat["global_batch_size"] = self.global_batch_size
        return argparse.Namespace(**flat)

    def replace(self, **flat: Any) -> "MilesConfig":
        """A copy with some flat fields changed (e.g. replace(run_dir=...))."""
        changed = {}
        for f in dataclasses.fields(self):
            section = getattr(self, f.name)
            names = {sf.name for sf in dataclasses.fields(section)}
            mine = {k: v for k, v in flat.items() if k in names}
            if mine:
                changed[f.name] = dataclasses.replace(section, **mine)
        unknown = set(flat) - {k for s in self.sections() for k in (x.name for x in dataclasses.fields(s))}
        if unknown:
            raise ConfigError(flag_name(sorted(unknown)[0]), "unknown config field")
        return dataclasses.replace(self, **changed)


SECTIONS = [f.default_factory for f in dataclasses.fields(MilesConfig)]


def parse_config(argv: list[str] | None = None, extra_sections: list[type] = (), prog: str = "miles train"):
    """Parse a training run's flags. Returns a MilesConfig (and the extra sections, if asked)."""
    parsed = parse_sections([*SECTIONS, *extra_sections], argv, prog=prog,
                            description="GRPO post-training; with no flags, the tiny CPU run.")
    names = [f.name for f in dataclasses.fields(MilesConfig)]
    config = MilesConfig(**{name: parsed[cls] for name, cls in zip(names, SECTIONS)})
    config.validate()
    if extra_sections:
        return config, [parsed[cls] for cls in extra_sections]
    return config


def redacted_flat_dict(config: MilesConfig) -> dict[str, Any]:
    """The flattened config with every secret-looking value replaced, safe to log or store."""
    out = {}
    for section in config.sections():
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if value is not None and (f.metadata.get("secret") or is_secret_name(f.name)):
                value = REDACTED
            out[f.name] = value
    out["data_parallel_size"] = config.data_parallel_size  # derived: the layout is TP x PP x this
    return out


def run_main(main: Callable[[], int | None], prog: str) -> NoReturn:
    """A `python -m` entry point: run `main`, turning a ConfigError into one clean line and exit 2, and
    Ctrl-C into one line and exit 130 (ASY3: a 40-line KeyboardInterrupt traceback; what `main` holds is
    closed by its own `finally` blocks as the interrupt unwinds, before this line)."""
    try:
        sys.exit(main())
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted (Ctrl-C); a run resumes from its last checkpoint with the same command",
              file=sys.stderr)
        sys.exit(130)
