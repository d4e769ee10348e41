"""This rank's swap files: where offloaded state lives, checked before it is created.

One folder per rank and process under --nvme-path, `zero_ref_swap_r<rank>_p<pid>`,
holding one file per array (master weights, m, v). Before creating anything the
folder is checked, by all ranks together: it must be a folder, be writable and
have room for the files of every rank that shares its filesystem (the ranks on
one host whose folder has the same st_dev: they draw on the same free space), or
every rank stops with one message naming the numbers. A clean exit removes the
folder; a killed run leaves it, and the next start on that path removes every
folder of a process that no longer runs, before the free space is measured, and
says so.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from zero_ref.io.atomic import process_alive
from zero_ref.io.disk_space import FreeBytes, disk_free_bytes
from zero_ref.offload.malloc import return_freed_arrays_to_os
from zero_ref.offload.swap_file import F32, OffloadIOError, OffloadSetupError, SwapFile


class HoldsOnDisk(Protocol):
    """What a store asks of the memory ledger it is handed (the engine's MemoryLedger,
    engine/memory.py): declared here, so that offload, below the engine, does not import it."""

    def hold_on_disk(self, category: str, name: str, array: np.ndarray) -> np.ndarray: ...


FOLDER = re.compile(r"zero_ref_swap_r(\d+)_p(\d+)$")


def check_folder(nvme_path: str) -> Path:
    """The folder, if it is one and is writable; else OffloadSetupError."""
    folder = Path(nvme_path)
    if folder.exists() and not folder.is_dir():
        raise OffloadSetupError(
            f"--nvme-path {folder}: is a file, not a folder (offload needs one)"
        )
    if not folder.is_dir():
        raise OffloadSetupError(f"--nvme-path {folder}: no such folder (offload needs one)")
    if not os.access(folder, os.W_OK):
        raise OffloadSetupError(f"--nvme-path {folder}: not writable")
    return folder


def check_space(nvme_path: str, nbytes: int, free_bytes: FreeBytes = disk_free_bytes) -> Path:
    """One process's check: the folder, if it is one, is writable and has nbytes free."""
    folder = check_folder(nvme_path)
    free = free_bytes(folder)
    if free < nbytes:
        raise OffloadSetupError(
            f"--nvme-path {folder}: {free:,} bytes free, the swap files need {nbytes:,}"
        )
    return folder


@dataclass(frozen=True)
class Sharer:
    """What a rank tells the others about its --nvme-path: where it lands, and how
    many bytes of swap files this rank will write there."""

    host: str
    device: int  # the folder's st_dev: its filesystem (-1: the folder is unusable)
    nbytes: int


def sharing_ranks(everyone: list[Sharer], rank: int) -> list[int]:
    """The ranks whose swap files land on the same filesystem as `rank`'s (itself too)."""
    mine = everyone[rank]
    return [r for r, s in enumerate(everyone) if (s.host, s.device) == (mine.host, mine.device)]


def check_shared_space(
    nvme_path: str, nbytes: int, mpi_comm, free_bytes: FreeBytes = disk_free_bytes
) -> tuple[Path, list[Path]]:
    """A collective over mpi_comm: every rank passes the bytes of swap files it will
    write (its optimizer state, parameters, gradients: the caller adds them up).
    The lowest rank of each group sharing a filesystem removes what dead runs left
    there, then measures its free space for the group; the group's sum must fit.
    Returns the folder and the stale folders this rank removed; any problem on any
    rank is raised on every rank (the lowest rank's message)."""
    rank, problem, folder, device = mpi_comm.Get_rank(), None, Path(nvme_path), -1
    try:
        folder = check_folder(nvme_path)
        device = folder.stat().st_dev
    except (OffloadSetupError, OSError) as e:
        problem = str(e)
    everyone = mpi_comm.allgather(Sharer(socket.gethostname(), device, int(nbytes)))
    group = sharing_ranks(everyone, rank)
    stale, free = [], None
    if problem is None and rank == group[0]:  # one cleaner and one measure per filesystem
        stale = remove_stale(folder)
        free = free_bytes(folder)
    frees = mpi_comm.allgather(free)  # after every group's cleanup
    need = sum(everyone[r].nbytes for r in group)
    if problem is None and frees[group[0]] < need:
        problem = (
            f"--nvme-path {folder}: {frees[group[0]]:,} bytes free, the swap files of the "
            f"{len(group)} rank(s) on {everyone[rank].host} that share its filesystem need "
            f"{need:,} (rank {rank}'s: {nbytes:,})"
        )
    problems = [p for p in mpi_comm.allgather(problem) if p is not None]
    if problems:
        raise OffloadSetupError(problems[0])
    return folder, stale


def remove_stale(folder: Path, rank: int | None = None) -> list[Path]:
    """Swap folders left by processes that no longer run (killed runs): of `rank`, or of
    any rank (a killed job of more ranks than this one leaves more folders)."""
    removed = []
    pattern = "zero_ref_swap_r*_p*" if rank is None else f"zero_ref_swap_r{rank}_p*"
    for entry in sorted(folder.glob(pattern)):
        match = FOLDER.match(entry.name)
        if match and not process_alive(int(match.group(2))):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


class NvmeStore:
    """This rank's swap files; arrays it makes are registered with the ledger as on disk."""

    def __init__(
        self,
        nvme_path: str,
        rank: int,
        ledger: HoldsOnDisk,
        nbytes: int,
        mpi_comm=None,
        free_bytes: FreeBytes = disk_free_bytes,
    ) -> None:
        """nbytes: every swap file this rank will make. With mpi_comm (a collective),
        the ranks sharing the folder's filesystem are checked together
        (check_shared_space); without, this process alone."""
        if mpi_comm is None:
            stale = remove_stale(check_folder(nvme_path))  # before measuring: it frees room
            parent = check_space(nvme_path, nbytes, free_bytes)
        else:
            parent, stale = check_shared_space(nvme_path, nbytes, mpi_comm, free_bytes)
        self.stale = stale  # reported by the trainer
        self.folder = parent / f"zero_ref_swap_r{rank}_p{os.getpid()}"
        try:
            self.folder.mkdir()
        except OSError as e:
            raise OffloadIOError(f"cannot create swap folder {self.folder}: {e}") from e
        self.memory, self.files = ledger, []
        self.malloc_returns_freed = return_freed_arrays_to_os()  # RAM is what the ledger says
        atexit.register(self.close)

    def zeros(self, category: str, name: str, numel: int, dtype: np.dtype = F32) -> np.ndarray:
        """A zero-filled array (float32 unless `dtype`) in a swap file of its own."""
        suffix = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[np.dtype(dtype).name]
        swap = SwapFile(self.folder / f"{name}.{suffix}", numel, dtype)
        self.files.append(swap)
        return self.memory.hold_on_disk(category, name, swap.array)

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
