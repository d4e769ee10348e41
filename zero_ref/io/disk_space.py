"""Free space on a folder's filesystem, as an unprivileged writer sees it: what the NVMe
swap files (zero_ref/offload/nvme.py) and a checkpoint save (zero_ref/checkpoint/space.py)
check before they write anything. A check takes the measure as an argument (FreeBytes),
so a test can hand it a small disk.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

FreeBytes = Callable[[Path], int]  # a folder -> the bytes its filesystem has free for us


def disk_free_bytes(folder: Path) -> int:
    """The bytes an unprivileged writer may still use on folder's filesystem."""
    return shutil.disk_usage(folder).free
