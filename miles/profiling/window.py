"""What a profiling window is (rollouts [start, end), targets, ranks) and where its files go."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from miles.record import layout

# The named spans of `train_overall`, in the order an iteration runs them.
PHASES = ("rollout", "log_probs", "actor_train", "update_weights", "checkpoint", "eval")
SUMMARIES = Path(layout.PROFILER_SUMMARIES).name


def profiler_dir(run_dir: Path) -> Path:
    """RUN_DIR/profiler: summaries, py-spy dumps, the Ray timeline (and traces by default)."""
    return Path(run_dir) / layout.PROFILER


def trace_root(config, run_dir: Path) -> Path:
    """Where traces go: a --tensorboard-dir the user gave (the TensorBoard profile plugin reads it), else
    RUN_DIR/profiler (a resolved config carries RUN_DIR/tensorboard when none was given: not a choice)."""
    given = config.tracking.tensorboard_dir
    default = (Path(run_dir) / layout.TENSORBOARD).absolute()
    if given and Path(given).expanduser().absolute() != default:
        return Path(given).expanduser().absolute()
    return profiler_dir(run_dir).absolute()


def worker_name(rank: int, coords=None) -> str:
    """`rank<r>`; a rank of a model-parallel layout (its `RankCoords`) adds where it sits:
    `rank<r>_dp<d>_pp<p>_tp<t>`, so each TP shard's and PP stage's trace says which it is."""
    if coords is None:
        return f"rank{rank}"
    return f"rank{rank}_dp{coords.dp}_pp{coords.pp}_tp{coords.tp}"


@dataclass(frozen=True)
class ProfileWindow:
    """Rollouts [start, end) profiled on `ranks` for `targets`; sent to the ranks as is."""

    start: int
    end: int
    targets: tuple[str, ...]
    ranks: tuple[int, ...]
    trace_root: str  # absolute
    run_dir: str  # absolute
    memory_path: str | None = None  # rank 0's file; None: no memory recording

    def __contains__(self, rollout_id: int) -> bool:
        return self.start <= rollout_id < self.end

    @property
    def label(self) -> str:
        return f"rollouts_{self.start}-{self.end}"

    def trace_path(self, target: str, rank: int, coords=None) -> Path:
        """`<root>/<target>_rollouts_S-E/<worker>.pt.trace.json.gz`: one TensorBoard run per target
        and window, one worker per rank (`worker_name`, the profile plugin's worker)."""
        name = f"{worker_name(rank, coords)}.pt.trace.json.gz"
        return Path(self.trace_root) / f"{target}_{self.label}" / name

    def engine_trace_dir(self) -> Path:
        return Path(self.trace_root) / f"rollout_{self.label}"

    def memory_file(self, rank: int) -> Path | None:
        """Rank 0 writes --memory-snapshot-path itself; rank r writes NAME_rank<r>.EXT beside it."""
        if self.memory_path is None:
            return None
        path = Path(self.memory_path)
        if rank == 0:
            return path
        suffixes = "".join(path.suffixes)
        return path.with_name(f"{path.name[:len(path.name) - len(suffixes)]}_rank{rank}{suffixes}")


def window_from_config(config, run_dir: Path, start: int | None = None, end: int | None = None) -> ProfileWindow:
    """The window the flags describe (or rollouts [start, end) with the same targets and ranks)."""
    p = config.profiling
    memory = str(Path(p.memory_snapshot_path).expanduser().absolute()) if p.record_memory_history else None
    return ProfileWindow(start=p.profile_step_start if start is None else start,
                         end=p.profile_step_end if end is None else end,
                         targets=tuple(dict.fromkeys(p.profile_target)), ranks=tuple(sorted(set(p.profile_ranks))),
                         trace_root=str(trace_root(config, run_dir)), run_dir=str(Path(run_dir).absolute()),
                         memory_path=memory)
