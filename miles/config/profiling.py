"""Settings of the profiler windows (Miles' FSDP and Megatron flags), memory history, py-spy and Ray timeline."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from miles.config.fields import ConfigError, flag

TARGETS = ("train_overall", "train_actor", "train_log_probs")
PYSPY_ENV = "MILES_DEBUG_PYSPY_DUMP_INTERVAL"  # Miles' env var for --py-spy-interval


def _pyspy_default() -> float | None:
    raw = os.environ.get(PYSPY_ENV)
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ConfigError("--py-spy-interval", f"{PYSPY_ENV}={raw!r} is not a number of seconds") from None


@dataclass(frozen=True)
class ProfilingConfig:
    """PyTorch profiler windows, memory history, engine traces, py-spy dumps and the Ray timeline."""

    use_pytorch_profiler: bool = flag(False, "profile rollouts [--profile-step-start, --profile-step-end)")
    profile_step_start: int = flag(10, "first profiled rollout id (absolute: a resumed run profiles the same ones)",
                                   minimum=0)
    profile_step_end: int = flag(12, "rollout id at which profiling stops (exclusive)", minimum=0)
    profile_target: list[str] = flag(["train_overall"], "what to profile (one or more)", choices=TARGETS)
    profile_ranks: list[int] = flag([0], "training ranks that profile", minimum=0)
    profile_rollout: bool = flag(False, "also profile every inference engine over the window (/start_profile)")
    record_memory_history: bool = flag(False, "record memory over the window (CUDA allocator history, or the "
                                              "profiler's memory timeline on CPU) into --memory-snapshot-path")
    memory_snapshot_path: str | None = flag(None, "memory file of rank 0 (other ranks: NAME_rank<r>.EXT)")
    py_spy_interval: float | None = flag(None, f"seconds between py-spy dumps of every process of the run "
                                               f"(env {PYSPY_ENV})", minimum=0.1)
    ray_timeline: bool = flag(False, "save Ray's task timeline as RUN_DIR/profiler/ray-timeline.json")

    def __post_init__(self) -> None:
        if self.py_spy_interval is None:
            object.__setattr__(self, "py_spy_interval", _pyspy_default())

    def validate(self) -> None:
        if self.use_pytorch_profiler and self.profile_step_end <= self.profile_step_start:
            raise ConfigError("--profile-step-end", f"must be greater than --profile-step-start "
                              f"({self.profile_step_start}), got {self.profile_step_end}")
        if self.use_pytorch_profiler and not self.profile_target:
            raise ConfigError("--profile-target", f"name at least one of: {', '.join(TARGETS)}")
        if self.record_memory_history and not self.memory_snapshot_path:
            raise ConfigError("--record-memory-history", "needs --memory-snapshot-path (where the file goes)")
        for name, on in (("--record-memory-history", self.record_memory_history),
                         ("--memory-snapshot-path", self.memory_snapshot_path),
                         ("--profile-rollout", self.profile_rollout)):
            if on and not self.use_pytorch_profiler:
                raise ConfigError(name, "works inside the profiling window: add --use-pytorch-profiler")
        if self.memory_snapshot_path and not self.record_memory_history:
            raise ConfigError("--memory-snapshot-path", "is written only with --record-memory-history")

    def validate_run(self, num_rollout: int, world_size: int, directories: dict[str, str | None]) -> None:
        """Checks against the rest of the run: the window inside --num-rollout, ranks that exist,
        and directories the profiler will write into (`directories`: flag -> path) writable."""
        if self.use_pytorch_profiler and self.profile_step_end > num_rollout:
            raise ConfigError("--profile-step-end", f"{self.profile_step_end} lies beyond --num-rollout "
                              f"{num_rollout} (rollout ids 0..{num_rollout - 1})")
        bad = [r for r in self.profile_ranks if r >= world_size]
        if self.use_pytorch_profiler and bad:
            raise ConfigError("--profile-ranks", f"{bad} not among the {world_size} training ranks "
                              f"(0..{world_size - 1})")
        if not self.writes_files:
            return
        for name, path in directories.items():
            if path is not None and not writable(Path(path)):
                raise ConfigError(name, f"{path} is not a writable directory")
        if self.memory_snapshot_path and not writable(Path(self.memory_snapshot_path).expanduser().parent):
            raise ConfigError("--memory-snapshot-path", f"directory of {self.memory_snapshot_path} is not writable")

    @property
    def writes_files(self) -> bool:
        return self.use_pytorch_profiler or self.py_spy_interval is not None or self.ray_timeline


def writable(directory: Path) -> bool:
    """Can files be created under `directory`: it, or the nearest existing parent it would be made
    in, is a directory this process may write into."""
    path = directory.expanduser().absolute()
    while not path.exists():
        if path.parent == path:
            return False
        path = path.parent
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)
