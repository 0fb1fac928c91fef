"""How a run's files are written and checked: whole or not at all (`write_atomic`,
`write_bytes_atomic`, `write_gzip_atomic`, `write_jsonl`, and `replacing` for a writer that streams:
the samples, eval prompts, token files, state files, a profiler trace, a trusted-run record, a
diagnose bundle), one process at a time where that matters (`file_lock`), and the content digest of
a file (a checkpoint's manifest, a made model's source wheel)."""
from __future__ import annotations

import fcntl
import gzip
import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator

BLOCK = 1 << 20  # read in 1 MiB blocks: a checkpoint's weights never sit in memory twice


@contextmanager
def replacing(path: Path, mode: int | None = None) -> Iterator[BinaryIO]:
    """A binary file that becomes `path` whole when the block ends, and is removed if it raises: a
    reader (or a kill) sees the old file or the new one, never half. The parent folder is made if
    missing.

    The temporary file has a fresh name beside `path`, created exclusively (mkstemp: O_EXCL): it is
    never a planted link written through (probe N37: a `<name>.tmp` symlink to a file outside); the
    rename then replaces a directory entry, never writes through one. Its permissions are `mode`,
    else those a plain `open(path, "w")` gives (0o666 less the umask), not mkstemp's 0o600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_umask() if mode is None else mode)
            yield f
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """This process's umask, read without setting it (os.umask sets it: a file another thread made
    in between would get the wrong permissions); 0o022 where /proc does not say."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def write_bytes_atomic(path: Path, data: bytes, mode: int | None = None) -> Path:
    """Write `data` to `path` whole (`replacing`)."""
    with replacing(path, mode) as f:
        f.write(data)
    return Path(path)


def write_atomic(path: Path, text: str, mode: int | None = None) -> Path:
    """Write `text` (UTF-8) to `path` whole (`replacing`)."""
    return write_bytes_atomic(path, text.encode("utf-8"), mode)


def write_gzip_atomic(path: Path, data: bytes | str, mode: int | None = None) -> Path:
    """Write `data` gzip-compressed to `path` whole (`replacing`; a str as UTF-8); the gzip header
    names `path`'s file, not the temporary one."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    name = Path(path).name
    with replacing(path, mode) as f, gzip.GzipFile(filename=name, mode="wb", fileobj=f) as packed:
        packed.write(raw)
    return Path(path)


@contextmanager
def file_lock(path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """An exclusive lock on the file `path` (made, with its folder, if missing) for the block: one
    holder at a time across processes. `on_wait()` is called once, before waiting, when another
    process holds it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


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
