"""This rank's swap files: where offloaded state lives, checked before it is created.

One folder per rank and process under --nvme-path, `zero_ref_swap_r<rank>_p<pid>`,
holding one file per array (master weights, m, v). Before creating anything the
folder's disk is checked: it must exist, be writable and have room for every
file, or the run stops with one message naming the numbers. A clean exit removes
the folder; a killed run leaves it, and the next start on that path finds it
(its process is gone), removes it and says so.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
from pathlib import Path

import numpy as np

from zero_ref.engine.memory import MemoryLedger
from zero_ref.io.atomic import process_alive
from zero_ref.offload.swap_file import F32, OffloadIOError, OffloadSetupError, SwapFile

FOLDER = re.compile(r"zero_ref_swap_r(\d+)_p(\d+)$")


def check_space(nvme_path: str, nbytes: int) -> Path:
    """The folder, if it exists, is writable and has nbytes free; else OffloadSetupError."""
    folder = Path(nvme_path)
    if not folder.is_dir():
        raise OffloadSetupError(f"--nvme-path {folder}: no such folder (offload needs one)")
    if not os.access(folder, os.W_OK):
        raise OffloadSetupError(f"--nvme-path {folder}: not writable")
    free = shutil.disk_usage(folder).free
    if free < nbytes:
        raise OffloadSetupError(
            f"--nvme-path {folder}: {free:,} bytes free, the swap files need {nbytes:,}"
        )
    return folder


def remove_stale(folder: Path, rank: int) -> list[Path]:
    """Swap folders of this rank left by processes that no longer run (killed runs)."""
    removed = []
    for entry in folder.glob(f"zero_ref_swap_r{rank}_p*"):
        match = FOLDER.match(entry.name)
        if match and not process_alive(int(match.group(2))):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


class NvmeStore:
    """This rank's swap files; arrays it makes are registered with the ledger as on disk."""

    def __init__(self, nvme_path: str, rank: int, ledger: MemoryLedger, nbytes: int) -> None:
        parent = check_space(nvme_path, nbytes)
        self.stale = remove_stale(parent, rank)  # reported by the trainer
        self.folder = parent / f"zero_ref_swap_r{rank}_p{os.getpid()}"
        try:
            self.folder.mkdir()
        except OSError as e:
            raise OffloadIOError(f"cannot create swap folder {self.folder}: {e}") from e
        self.ledger, self.files = ledger, []
        atexit.register(self.close)

    def zeros(self, category: str, name: str, numel: int, dtype: np.dtype = F32) -> np.ndarray:
        """A zero-filled array (float32 unless `dtype`) in a swap file of its own."""
        suffix = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[np.dtype(dtype).name]
        swap = SwapFile(self.folder / f"{name}.{suffix}", numel, dtype)
        self.files.append(swap)
        return self.ledger.hold_on_disk(category, name, swap.array)

    def locate(self, view: np.ndarray) -> tuple[SwapFile, int] | None:
        """(its swap file, its element offset) for a view of a swap-file array, else None."""
        for swap in self.files:
            if swap.numel and np.shares_memory(view, swap.array):
                return swap, swap.offset_of(view)
        return None

    def release_all(self) -> None:
        """Drop every swap page from RAM (after bulk access through the mappings)."""
        for swap in self.files:
            swap.release()

    def close(self) -> None:
        """Remove the swap files and their folder (at a clean exit)."""
        for swap in self.files:
            swap.close()
        self.files = []
        shutil.rmtree(self.folder, ignore_errors=True)


def swap_bytes(numel: int, n_arrays: int, itemsize: int = F32.itemsize) -> int:
    return n_arrays * numel * itemsize
