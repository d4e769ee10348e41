"""Is the MPI library CUDA-aware? Asked once at start, answered in the run's first line.

A CUDA-aware MPI reads and writes device memory itself: a collective on device
buffers costs no copy through the host. The MPI wheels on PyPI (MPICH, Open
MPI) are not CUDA-aware, and handing them a device pointer crashes; so the
answer decides the path: device buffers straight to MPI, or staged through
reused host buffers (zero_ref/comm/staging.py), one copy each way.

The library is asked through its extension functions, looked up in the MPI
library mpi4py loaded: `MPIX_Query_cuda_support()` (Open MPI, MPICH 4 and
later) or `MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &flag)` (MPICH 4
and later). A library with neither cannot say, and is taken as not aware.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

from zero_ref.config import CUDA_AWARE_CHOICES as CHOICES

MPIX_GPU_SUPPORT_CUDA = 0  # MPICH's mpi.h: enum { MPIX_GPU_SUPPORT_CUDA, _ZE, _HIP }


class CudaAwareMPIError(ValueError):
    """--cuda-aware-mpi yes on a library that says it is not: bad input, before training."""


@dataclass(frozen=True)
class MPIPath:
    """How device buffers reach MPI, and why."""

    cuda_aware: bool  # True: device buffers go to MPI directly; False: staged through host
    reason: str  # for the run's first line

    def describe(self) -> str:
        path = "device buffers to MPI directly" if self.cuda_aware else "staged through host"
        return f"MPI: {path} ({self.reason})"


def loaded_mpi_library() -> Path | None:
    """The MPI shared library this process has mapped (mpi4py loads it), if any."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    for line in maps:
        path = line.split()[-1] if "/" in line else ""
        name = Path(path).name
        if name.startswith(("libmpi.so", "libmpi_", "libmpich")) and ".so" in name:
            return Path(path)
    return None


def library_says_cuda_aware(library: Path | None = None) -> bool | None:
    """The library's own answer: True or False, or None when it has no way to say."""
    library = library or loaded_mpi_library()
    if library is None:
        return None
    try:
        lib = ctypes.CDLL(str(library))
    except OSError:
        return None
    if hasattr(lib, "MPIX_Query_cuda_support"):
        lib.MPIX_Query_cuda_support.restype = ctypes.c_int
        return bool(lib.MPIX_Query_cuda_support())
    if hasattr(lib, "MPIX_GPU_query_support"):
        flag = ctypes.c_int(0)
        if lib.MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, ctypes.byref(flag)) == 0:
            return bool(flag.value)
    return None


def choose_path(requested: str, library: bool | None) -> MPIPath:
    """--cuda-aware-mpi auto|yes|no against what the library says (pure: tested alone)."""
    if requested not in CHOICES:
        raise ValueError(f"--cuda-aware-mpi {requested!r}: allowed are {', '.join(CHOICES)}")
    said = {True: "says it is", False: "says it is not", None: "cannot say"}[library]
    if requested == "no":
        return MPIPath(False, f"--cuda-aware-mpi no; the library {said} CUDA-aware")
    if requested == "yes":
        if library is False:
            raise CudaAwareMPIError(
                "--cuda-aware-mpi yes, but the MPI library says it is not CUDA-aware "
                "(MPIX_Query_cuda_support() = 0): handing it device buffers would crash. "
                "Use --cuda-aware-mpi auto or no, or an MPI built with CUDA."
            )
        return MPIPath(True, f"--cuda-aware-mpi yes; the library {said} CUDA-aware")
    return MPIPath(library is True, f"auto: the library {said} CUDA-aware")
