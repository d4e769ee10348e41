"""Writing files so that a crash never leaves a half-written file under the real name.

Write to a temporary name in the same directory, flush and fsync it, rename it
over the real name (atomic on POSIX), then fsync the directory so the rename
itself survives a power cut. A writer killed half-way leaves only the hidden
temporary, which the next run removes (zero_ref/app/output_paths.py). The metrics
log is append-only instead (zero_ref/io/metrics_log.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import IO


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], None]) -> Path:
    """Call write(f) on a temporary file, then move it to `path` atomically."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    return atomic_write(path, lambda f: f.write(data))


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def process_alive(pid: int) -> bool:
    """Is process `pid` still running? Scratch a dead process left behind (a hidden
    temporary, a swap folder) may be removed; a live one's, or another user's, not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: not ours to remove
    return True
