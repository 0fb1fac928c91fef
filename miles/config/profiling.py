"""Settings of the profiler windows (Miles' FSDP and Megatron flags)."""
from __future__ import annotations

from dataclasses import dataclass

from miles.config.fields import ConfigError, flag


@dataclass(frozen=True)
class ProfilingConfig:
    """PyTorch profiler windows and memory snapshots."""

    use_pytorch_profiler: bool = flag(False, "profile rollouts --profile-step-start .. --profile-step-end")
    profile_step_start: int = flag(10, "first profiled rollout", minimum=0)
    profile_step_end: int = flag(12, "rollout at which profiling stops (exclusive)", minimum=0)
    profile_target: list[str] = flag(["train_overall"], "what to profile",
                                     choices=("train_overall", "train_actor", "train_log_probs"))
    memory_snapshot_path: str | None = flag(None, "write a CUDA memory snapshot here")

    def validate(self) -> None:
        if self.use_pytorch_profiler and self.profile_step_end <= self.profile_step_start:
            raise ConfigError("--profile-step-end", f"must be greater than --profile-step-start "
                              f"({self.profile_step_start}), got {self.profile_step_end}")
