"""Atomic, verifiable checkpoints: staged in a hidden directory, sealed by a manifest of checksums, renamed.

Layout: SAVE/iter_0000012/ holds the backend's files (model.safetensors in HF layout,
optimizer.pt, scheduler.pt, rng_rank*.pt), trainer_state.json and, written last,
manifest.json (sha256 and size of every other file). A directory is only ever seen
under its final name complete, and `latest_good` re-hashes before trusting one, so a
crash mid-write or a corrupted file is reported and the previous good checkpoint used.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass, field
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from miles.config.parallel import RankLayout
from miles.record.files import file_sha256

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
STATE = "trainer_state.json"
PREFIX = "iter_"
STAGING_PREFIX = ".staging-"


@dataclass
class TrainerState:
    """What the driver needs to continue: the next rollout comes after `rollout_id`."""

    rollout_id: int
    weight_version: int
    data_cursor: dict[str, int]
    world_size: int
    extra: dict[str, Any] = field(default_factory=dict)
    # the ranks' layout {"tp", "pp", "dp"} the checkpoint was saved with (its optimizer state is
    # per rank); unset: TP = PP = 1 over `world_size` ranks, the only layout before it was recorded
    parallel: dict[str, int] | None = None

    def __post_init__(self):
        if self.parallel is None:
            self.parallel = {"tp": 1, "pp": 1, "dp": self.world_size}

    @property
    def layout(self) -> RankLayout:
        return RankLayout(**self.parallel)


@dataclass
class Rejected:
    path: Path
    reason: str


@dataclass
class CheckpointScan:
    """The newest checkpoint that verified (or None) and every newer one that did not."""

    path: Path | None
    state: TrainerState | None
    rejected: list[Rejected]


def checkpoint_name(rollout_id: int) -> str:
    return f"{PREFIX}{rollout_id:07d}"


def staging_dir(save_dir: Path, rollout_id: int) -> Path:
    path = save_dir / f"{STAGING_PREFIX}{checkpoint_name(rollout_id)}-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    return path


@contextmanager
def staging(save_dir: Path, rollout_id: int) -> Iterator[Path]:
    """A staging dir that is gone again when saving into it fails or is interrupted (Ctrl-C, probe
    ASY3): a checkpoint is either sealed or never begun, never left half-written for a resume to
    clean up."""
    path = staging_dir(save_dir, rollout_id)
    try:
        yield path
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


def _fsync_file(path: Path) -> None:
    with path.open("rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def seal(staged: Path, save_dir: Path, state: TrainerState, keep: int) -> Path:
    """Write the state and manifest into `staged`, flush, rename to its final name, prune old ones."""
    (staged / STATE).write_text(json.dumps(state.__dict__, indent=2, sort_keys=True))
    files = sorted(p for p in staged.iterdir() if p.is_file() and p.name != MANIFEST)
    manifest = {"format": 1, "rollout_id": state.rollout_id,
                "files": {p.name: {"sha256": file_sha256(p), "bytes": p.stat().st_size} for p in files}}
    for p in files:
        _fsync_file(p)
    (staged / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    _fsync_file(staged / MANIFEST)
    final = save_dir / checkpoint_name(state.rollout_id)
    if final.exists():  # a retried chunk re-saves the same iteration: replace it whole
        shutil.rmtree(final)
    os.rename(staged, final)
    _fsync_dir(save_dir)
    prune(save_dir, keep)
    return final


def verify(path: Path) -> str | None:
    """None when the checkpoint is complete and intact, else why not."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        return "no manifest.json (half-written)"
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        return f"unreadable manifest.json: {exc}"
    if STATE not in files:
        return f"manifest does not list {STATE}"
    for name, meta in files.items():
        p = path / name
        if not p.is_file():
            return f"missing file {name}"
        if p.stat().st_size != meta["bytes"]:
            return f"{name} has {p.stat().st_size} bytes, manifest says {meta['bytes']}"
        if file_sha256(p) != meta["sha256"]:
            return f"{name} checksum mismatch"
    return None


def read_state(path: Path) -> TrainerState:
    return TrainerState(**json.loads((path / STATE).read_text()))


def layout_change(saved: TrainerState, current: RankLayout) -> str | None:
    """None when a checkpoint was saved with the ranks' `current` layout, else why resuming it is a
    reshard, naming both layouts (the backend decides whether it can reshard or must refuse)."""
    if saved.layout == current:
        return None
    return (f"the checkpoint was saved with {saved.layout.describe()} training ranks, this run has "
            f"{current.describe()}")


def candidates(save_dir: Path) -> list[Path]:
    """Checkpoint directories, newest first (staging directories are never candidates)."""
    if not save_dir.is_dir():
        return []
    found = [p for p in save_dir.iterdir() if p.is_dir() and p.name.startswith(PREFIX)
             and p.name[len(PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]), reverse=True)


def is_one_checkpoint(path: Path) -> bool:
    """`path` names one checkpoint (SAVE/iter_0000004, or any directory holding a manifest.json), not a
    directory of them."""
    return (path.name.startswith(PREFIX) and path.name[len(PREFIX):].isdigit()) or (path / MANIFEST).is_file()


def latest_good(save_dir: Path) -> CheckpointScan:
    """The newest checkpoint of `save_dir` that verifies; `save_dir` may also name one checkpoint
    (`--load RUN/checkpoints/iter_0000004`, D5), which is then the only candidate."""
    if is_one_checkpoint(save_dir):
        reason = verify(save_dir) if save_dir.is_dir() else "it does not exist"
        if reason is None:
            return CheckpointScan(save_dir, read_state(save_dir), [])
        return CheckpointScan(None, None, [Rejected(save_dir, reason)])
    rejected = []
    for path in candidates(save_dir):
        reason = verify(path)
        if reason is None:
            return CheckpointScan(path, read_state(path), rejected)
        log.warning("checkpoint %s is not usable (%s); trying an older one", path, reason)
        rejected.append(Rejected(path, reason))
    return CheckpointScan(None, None, rejected)


def resume_point(save_dir: Path, load_dir: Path) -> CheckpointScan:
    """Where a run resumes: the newest good checkpoint of --load, or of --save when that is newer (the run's
    own progress past what it loaded: a later chunk of the flow, a restarted run)."""
    scan = latest_good(load_dir)
    if Path(save_dir) == Path(load_dir):
        return scan
    own = latest_good(save_dir)
    if own.path is not None and (scan.path is None or own.state.rollout_id >= scan.state.rollout_id):
        return CheckpointScan(own.path, own.state, scan.rejected + own.rejected)
    return CheckpointScan(scan.path, scan.state, scan.rejected + own.rejected)


def check_load(save_dir: Path, load_dir: Path) -> str | None:
    """Why an explicit --load (one other than --save) cannot be resumed from, or None: it must exist and be
    a directory of checkpoints holding one, or one checkpoint that verifies; else the run would silently
    start from the base model (D5)."""
    save_dir, load_dir = Path(save_dir), Path(load_dir)
    if save_dir == load_dir:
        return None
    if not load_dir.is_dir():
        return f"{load_dir} does not exist or is not a directory"
    if is_one_checkpoint(load_dir):
        reason = verify(load_dir)
        return None if reason is None else f"{load_dir} is not a usable checkpoint: {reason}"
    if not candidates(load_dir):
        return (f"{load_dir} holds no checkpoint ({PREFIX}NNNNNNN directories); give a checkpoint directory "
                f"(RUN_DIR/checkpoints) or one checkpoint in it")
    return None


def prune(save_dir: Path, keep: int) -> None:
    """Keep the newest `keep` good checkpoints; drop older ones and stale staging directories."""
    good = [p for p in candidates(save_dir) if (p / MANIFEST).is_file()]
    for old in good[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in save_dir.glob(f"{STAGING_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)


def resume_message(path: Path, rollout_id: int, journal) -> str:
    """A chunk that starts where the last one checkpointed continues the run; only a run whose journal went
    past its checkpoint (a crash, a killed worker, a retry) resumes, and redoes those rollouts."""
    lost = sorted({ln.rollout_id for ln in journal if ln.rollout_id > rollout_id})
    if not lost:
        return f"[trainer] continuing from {path} (rollout {rollout_id})"
    return (f"[trainer] resumed from {path} (rollout {rollout_id}) after an interruption: "
            f"redoing rollout{'s' * (len(lost) > 1)} {lost[0]}" + (f"..{lost[-1]}" if len(lost) > 1 else ""))
