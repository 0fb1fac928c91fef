"""What a run that names a catalog checkpoint falls back on: the checkpoint's cached directory and its
chat task's files (when the flags name no prompt data), named without touching the disk; and the steps
that make them once."""
from __future__ import annotations

import json
import time
from pathlib import Path

from miles.config.resolve import TaskDefaults
from miles.config.checkpoints import CATALOG, Pretrained, checkpoint_dir, is_made, named, task_dir

EVAL_NAME = "arith"


def task_defaults(entry: Pretrained) -> TaskDefaults:
    data = task_dir(entry)
    return TaskDefaults(model=checkpoint_dir(entry), train_data=data / "train.jsonl",
                        eval_data=data / "eval.jsonl", eval_name=EVAL_NAME)


def with_named_checkpoint(config) -> tuple[object, TaskDefaults | None]:
    """`config` with a catalog name in --hf-checkpoint replaced by its cache directory, and that entry's
    task; `(config, None)` when the run names no catalog checkpoint."""
    entry = named(config.rollout.hf_checkpoint)
    if entry is None:
        return config, None
    return config.replace(hf_checkpoint=str(checkpoint_dir(entry))), task_defaults(entry)


def entry_of(config) -> Pretrained | None:
    """The catalog entry whose cache directory a resolved config trains, if any."""
    model = config.rollout.hf_checkpoint
    return next((e for e in CATALOG.values() if model and Path(model) == checkpoint_dir(e)), None)


def make_task_data(config) -> None:
    """Write the chat task's files if the run uses them (milliseconds; deterministic)."""
    entry = entry_of(config)
    if entry is not None and config.rollout.prompt_data == str(task_defaults(entry).train_data):
        from miles.pretrained.chat_task import write_chat_task

        write_chat_task(task_dir(entry))


def model_missing(config) -> Path | None:
    entry = entry_of(config)
    return None if entry is None or is_made(entry) else checkpoint_dir(entry)


def make_model(config) -> Path | None:
    """Make the catalog checkpoint the run uses if it is missing, saying so; its directory when made here."""
    entry = entry_of(config)
    if entry is None or is_made(entry):
        return None
    from miles.pretrained.make import make_checkpoint

    print(f"[prepare] making {entry.name} from {entry.requirement} (first run on this machine only, "
          f"1-2 min): {checkpoint_dir(entry)}", flush=True)
    start = time.time()
    path = make_checkpoint(entry)
    facts = json.loads((path / "made.json").read_text())
    print(f"[prepare] {entry.name} made in {time.time() - start:.0f}s ({facts['parameters'] / 1e6:.1f}M parameters, "
          f"{facts['architecture']}); cached for the next runs", flush=True)
    return path
